"""`servefleet up` restarts a replica that is alive but not doing its job: hung after being
ready (SIGSTOP), or never ready. The rule is pure (``Liveness``); one real process checks the
supervisor's use of it."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from servefleet.fleet.liveness import Liveness
from test_fleet import free_ports, make_fleet
from test_gateway_support import wait_for


def test_liveness_restarts_the_hung_and_the_never_ready():
    live = Liveness(ready_timeout=10.0, unhealthy_after=3.0)
    live.restarted(0.0)
    assert live.observe(5.0, False) is None  # still loading
    assert "not ready" in live.observe(10.5, False)
    live.restarted(20.0)
    assert live.observe(21.0, True) is None  # ready
    assert live.observe(23.0, False) is None  # a blip
    assert live.observe(24.5, True) is None
    assert live.observe(27.0, False) is None
    assert "health check failed for 3 s" in live.observe(27.6, False)


def test_a_sigstopped_replica_is_killed_and_restarted(tmp_path: Path):
    from servefleet.fleet.commands import Spec
    from servefleet.fleet.proc import Child
    from servefleet.fleet.supervisor import Supervisor, Timing

    port, gw_port = free_ports(2)
    said: list[str] = []
    sup = Supervisor(
        make_fleet([port, gw_port]),
        tmp_path,
        timing=Timing(health_interval=0.2, unhealthy_after=1.0, backoff_base=0.1),
        say=said.append,
    )
    argv = [sys.executable, "-m", "servefleet.sim.server", "--model", "Qwen2.5-7B", "--gpu",
            "H200-SXM", "--port", str(port), "--startup-time", "0", "--log-level", "warning"]  # fmt: skip
    child = Child(
        Spec("replica-0", argv, port, ready_marker="sim-server ready"), tmp_path / "r.log"
    )
    sup.replicas.append(child)
    try:
        sup._spawn(child)
        assert child.wait_ready(time.monotonic() + 30) is None
        first = child.pid
        sup.check_hung()  # seen ready
        child.proc.send_signal(signal.SIGSTOP)

        def restarted() -> bool:
            sup.check()
            sup.check_hung()
            return child.restarts == 1 and child.alive()

        wait_for(restarted, 30, "the hung replica to be restarted", every=0.1)
        assert child.pid != first
        assert any("health check failed" in s and "killing it" in s for s in said), said
        assert child.wait_ready(time.monotonic() + 30) is None
    finally:
        child.stop(5)
