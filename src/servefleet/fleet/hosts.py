"""`servefleet up` across hosts: which replicas of a fleet.yaml this host starts, where they
listen, and where the gateway reaches each one (docs/up.md).

Rule, local or remote: a replica is this host's when its ``host`` is ``localhost`` (or
127.0.0.1, ::1), this machine's name (``hostname``, or its fully qualified name), or a name
given to ``up --this-host``. `up` starts the local replicas; the others are remote: another
host's `up` starts them, and this host's gateway joins them at ``http://<host>:<port>`` and
health-checks them like the local ones.

Rule, the address a local replica listens on: ``localhost`` -> 127.0.0.1 (reachable from this
host only, as before); an IP address -> that address; a name -> every interface (0.0.0.0),
because a name may resolve here to a loopback address (Debian maps the hostname to 127.0.1.1)
that other hosts cannot reach.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from servefleet.plan.fleet_yaml import Fleet, Replica

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class Placement:
    """This host's view of a fleet: the names that mean "here"."""

    this_host: tuple[str, ...] = ()
    """Extra names of this host (`up --this-host`)."""
    hostnames: tuple[str, ...] = ()
    """This machine's own names (default: hostname and FQDN, see ``here``)."""

    @classmethod
    def here(cls, this_host: tuple[str, ...] = ()) -> Placement:
        return cls(this_host, (socket.gethostname(), socket.getfqdn()))

    def is_local(self, r: Replica) -> bool:
        return r.host in LOCAL_HOSTS or r.host in self.this_host or r.host in self.hostnames

    def local(self, fleet: Fleet) -> list[Replica]:
        return [r for r in fleet.replicas if self.is_local(r)]

    def remote(self, fleet: Fleet) -> list[Replica]:
        return [r for r in fleet.replicas if not self.is_local(r)]

    def bind(self, r: Replica) -> str:
        """The address a local replica listens on."""
        if r.host in LOCAL_HOSTS:
            return "::1" if r.host == "::1" else "127.0.0.1"
        return r.host if _is_ip(r.host) else "0.0.0.0"

    def connect(self, r: Replica) -> str:
        """The address this host reaches a replica at."""
        if not self.is_local(r):
            return r.host
        bind = self.bind(r)
        return "127.0.0.1" if bind == "0.0.0.0" else bind

    def url(self, r: Replica) -> str:
        return f"http://{url_host(self.connect(r))}:{r.port}"
