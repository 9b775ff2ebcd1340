"""Replicas found at run time: the endpoints of Kubernetes headless Services, read from the
API server's EndpointSlices (``discovery.k8s.io/v1``), polled.

::

    API server                          replicas_from_slices()            ReplicaSet
    GET .../endpointslices       ──►    JSON -> ReplicaConfig, one    ──► apply(static + found)
      ?labelSelector=kubernetes.io/     per pod (name = the pod's)        only when `found`
      service-name=<service>            pure, no I/O                      changed
    every `interval` s; an error keeps the last set (a replica is never dropped because the
    API could not be read)

Each discovered replica is a replica like those of ``replicas:``: health-checked, capped
(``max_in_flight``), routed to by the policy. Its name is its pod's name, stable across
restarts of a StatefulSet's pod, so session and prefix affinity (which hash replica names)
agree between several gateways and survive a pod's new address.

Rule: an endpoint counts unless it is terminating (``conditions.terminating``); not-ready
endpoints count too (a loading pod), because the gateway's own health checks decide when a
replica gets traffic, as for the replicas `servefleet up` starts. ``ready_only: true`` counts
ready endpoints only.

The configuration (the ``discovery:`` section of the gateway's config file)::

    discovery:
      kubernetes:
        services:
          - service: qwen-tp2-default          # a headless Service
            port: http                          # the port's name (or number) in the slices
            replica: {pool: default, max_in_flight: 24, tp: 2, gpu: V100-SXM2-32G}
        namespace: null      # default: the pod's own (its service account's namespace file)
        api_url: null        # default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
        interval: 5

The gateway's service account needs ``get``/``list`` on ``endpointslices`` of
``discovery.k8s.io`` (``servefleet export k8s`` writes the Role).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from servefleet.gateway.config import (
    SERVICE_ACCOUNT,
    DiscoveryConfig,
    GatewayConfig,
    KubernetesDiscovery,
    ReplicaConfig,
    ServiceSource,
)
from servefleet.gateway.log import event

if TYPE_CHECKING:
    from servefleet.gateway.replica import ReplicaSet

__all__ = ["DiscoveryConfig", "KubernetesDiscovery", "ServiceSource"]
SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
SERVICE_LABEL = "kubernetes.io/service-name"


# -- pure: EndpointSlices -> replicas ---------------------------------------------------------
def _slice_port(slice_: dict, want: str | int) -> int | None:
    for p in slice_.get("ports") or []:
        if (isinstance(want, int) and p.get("port") == want) or p.get("name") == want:
            return p.get("port")
    return None


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def replicas_from_slices(
    slices: dict, source: ServiceSource, ready_only: bool = False
) -> list[ReplicaConfig]:
    """The replicas of one Service from its EndpointSliceList (the API's JSON): one per
    endpoint that is not terminating (and ready, with ``ready_only``), named after its pod,
    sorted by name. A pod listed twice (slices being rewritten) counts once."""
    found: dict[str, ReplicaConfig] = {}
    for s in slices.get("items") or []:
        port = _slice_port(s, source.port)
        if port is None or s.get("addressType") not in ("IPv4", "IPv6", "FQDN"):
            continue
        for ep in s.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            if cond.get("terminating") is True:
                continue
            if ready_only and cond.get("ready") is False:
                continue
            addresses = ep.get("addresses") or []
            if not addresses:
                continue
            ref = ep.get("targetRef") or {}
            name = ref.get("name") if ref.get("kind", "Pod") == "Pod" else None
            name = name or f"{source.service}-{addresses[0]}"
            if name in found:
                continue
            url = f"http://{_host(addresses[0])}:{port}"
            found[name] = ReplicaConfig.model_validate({**source.replica, "url": url, "name": name})
    return [found[k] for k in sorted(found)]


# -- the poller ---------------------------------------------------------------------------------
def _api_url(cfg: KubernetesDiscovery) -> str | None:
    if cfg.api_url:
        return cfg.api_url.rstrip("/")
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
    )
    return f"https://{_host(host)}:{port}" if host else None


def _namespace(cfg: KubernetesDiscovery) -> str:
    if cfg.namespace:
        return cfg.namespace
    try:
        return (SERVICE_ACCOUNT / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


OnChange = Callable[[list["ReplicaConfig"]], Awaitable[object]]


class KubernetesWatcher:
    """Polls the EndpointSlices of the configured Services and calls ``on_change(found)``
    when the replicas found differ from the last call's."""

    def __init__(self, cfg: KubernetesDiscovery, on_change: OnChange) -> None:
        self.cfg = cfg
        self.on_change = on_change
        self.found: list[ReplicaConfig] = []
        self.api = _api_url(cfg)
        self.namespace = _namespace(cfg)
        self._session = None
        self._task: asyncio.Task | None = None
        self._last_error: str | None = None

    async def start(self) -> None:
        """Poll once (so that the gateway starts with the replicas known now), then every
        ``interval`` s in the background."""
        import aiohttp

        ssl_ctx: ssl.SSLContext | bool = True
        ca = self.cfg.ca_file
        if self.api and self.api.startswith("https://") and ca and Path(ca).exists():
            ssl_ctx = ssl.create_default_context(cafile=ca)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.cfg.timeout),
            connector=aiohttp.TCPConnector(ssl=ssl_ctx),
        )
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="kubernetes-discovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.interval)
            await self.refresh()

    async def refresh(self) -> None:
        """One poll; apply what it found if it changed. Errors are logged once each and keep
        the replicas found before."""
        result = await self.poll()
        if isinstance(result, str):
            if result != self._last_error:
                event(logging.WARNING, "discovery_failed", why=result)
            self._last_error = result
            return
        self._last_error = None
        if result != self.found:
            self.found = result
            event(logging.INFO, "discovery_changed", replicas=[r.key for r in result])
            await self.on_change(result)

    async def poll(self) -> list[ReplicaConfig] | str:
        """Every Service's replicas, or why they could not be read (a message)."""
        if self.api is None:
            return (
                "not inside a Kubernetes pod (no KUBERNETES_SERVICE_HOST): set "
                "discovery.kubernetes.api_url"
            )
        out: list[ReplicaConfig] = []
        for source in self.cfg.services:
            got = await self._fetch(source)
            if isinstance(got, str):
                return got
            out += replicas_from_slices(got, source, self.cfg.ready_only)
        return out

    def _headers(self) -> dict[str, str] | str:
        h = {"Accept": "application/json"}
        if self.cfg.token_file:
            try:
                h["Authorization"] = "Bearer " + Path(self.cfg.token_file).read_text().strip()
            except OSError as e:
                return f"cannot read the token {self.cfg.token_file}: {e.strerror}"
        return h

    async def _fetch(self, source: ServiceSource) -> dict | str:
        import aiohttp

        headers = self._headers()
        if isinstance(headers, str):
            return headers
        url = (
            self.api
            + SLICES_PATH.format(namespace=quote(self.namespace))
            + "?labelSelector="
            + quote(f"{SERVICE_LABEL}={source.service}")
        )
        assert self._session is not None
        try:
            async with self._session.get(url, headers=headers) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    return f"GET {url}: HTTP {resp.status}: {text}"
                return await resp.json()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            return f"GET {url}: {type(e).__name__}: {e}"


# -- the gateway's hook -------------------------------------------------------------------------
async def start_discovery(cfg: GatewayConfig, replicas: ReplicaSet) -> KubernetesWatcher | None:
    """Start discovery when ``cfg.discovery`` is set: the gateway's replicas become the static
    ones (``cfg.replicas``, read at each change, so a reload's list counts) plus those found."""
    if cfg.discovery is None:
        return None

    async def apply(found: list[ReplicaConfig]) -> None:
        await replicas.apply([*cfg.replicas, *found])

    watcher = KubernetesWatcher(cfg.discovery.kubernetes, apply)
    await watcher.start()
    return watcher


def discovered(watcher: KubernetesWatcher | None) -> list[ReplicaConfig]:
    """The replicas discovery found last (none without discovery)."""
    return [] if watcher is None else list(watcher.found)
