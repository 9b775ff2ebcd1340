"""Start a fleet's processes, wait until they are ready, keep them running (restart with
backoff), and drain them in order (gateway first, then replicas) when asked to stop."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from servefleet.plan.fleet_yaml import Fleet

from .commands import (
    FleetError,
    SimOptions,
    Spec,
    check_ports,
    gateway_config,
    gateway_spec,
    replica_specs,
)
from .hosts import Placement
from .liveness import Liveness
from .proc import Child, health_ok
from .state import PID_FILE, running_supervisor, write_state


@dataclass(frozen=True)
class Timing:
    ready_timeout: float = 600.0
    """Seconds a replica may take to be ready (vLLM loads weights, compiles graphs)."""
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    stable_after: float = 60.0
    """A replica up this long has its backoff reset."""
    drain_timeout: float = 30.0
    kill_timeout: float = 10.0
    health_interval: float = 1.0
    unhealthy_after: float = 30.0
    """A replica that was ready and then fails its health check this long (hung, SIGSTOPped)
    is killed and restarted, as is one not ready within ready_timeout of a restart."""


Say = Callable[[str], None]


class Supervisor:
    def __init__(
        self,
        fleet: Fleet,
        state_dir: Path,
        *,
        sim: SimOptions | None = None,
        timing: Timing | None = None,
        say: Say | None = None,
        clock: Callable[[], float] = time.monotonic,
        gpu_metrics_port: int = 9400,
        placement: Placement | None = None,
        with_gateway: bool = True,
    ) -> None:
        self.fleet = fleet
        self.placement = placement or Placement()
        """Which replicas are this host's (hosts.py); the others are joined by the gateway."""
        self.with_gateway = with_gateway
        """False on a host that only runs replicas for another host's gateway."""
        self.state_dir = Path(state_dir)
        self.sim = sim or SimOptions()
        self.timing = timing or Timing()
        self.say = say or (lambda msg: None)
        self.clock = clock
        self.replicas: list[Child] = []
        self.gateway: Child | None = None
        self._due: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._started_at: dict[str, float] = {}
        self._liveness: dict[str, Liveness] = {}
        self._probed_at = 0.0
        self._owns_pid_file = False
        self.gpu_metrics_port = gpu_metrics_port
        self.telemetry = None
        """The GPU telemetry endpoint (``servefleet.telemetry``), when serving."""

    # -- start -----------------------------------------------------------------------------
    @property
    def gateway_url(self) -> str | None:
        return f"http://127.0.0.1:{self.fleet.gateway.port}" if self.with_gateway else None

    def children(self) -> list[Child]:
        return [*self.replicas, *([self.gateway] if self.gateway else [])]

    def start(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Start every replica; start the gateway as soon as a replica of every pool is ready
        (its /ready names the others while they load); return once all are ready. Raises
        FleetError (having stopped whatever it started) when something cannot start."""
        if (pid := running_supervisor(self.state_dir)) is not None:
            raise FleetError(
                f"a fleet is already up in {self.state_dir} (pid {pid}): "
                "`servefleet down` first, or use another --state-dir"
            )
        specs = replica_specs(self.fleet, self.sim, self.placement)
        if not specs and not self.with_gateway:
            raise FleetError(
                "nothing to start here: no replica of fleet.yaml is on this host "
                "(host: localhost, this machine's name, or --this-host) and --no-gateway"
            )
        check_ports(self.fleet, self.placement, self.with_gateway)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / PID_FILE).write_text(str(os.getpid()))
        self._owns_pid_file = True
        logs = self.state_dir / "logs"

        def routable() -> None:
            self.start_telemetry()  # before the gateway: serving by the time the fleet is ready
            if self.with_gateway:
                self._start_gateway(logs, routable=self._every_pool_local())
                if on_ready:
                    on_ready("gateway")

        try:
            self._start_replicas(specs, logs, on_ready, routable)
            self.write_state("up")
        except BaseException:
            self.shutdown(quiet=True)
            raise

    def _start_gateway(self, logs: Path, routable: bool) -> None:
        """The gateway in front of every replica of the fleet, this host's and the others'.
        Ready once a replica is routable, or once it listens when no replica is this host's
        (the others may still be loading)."""
        cfg_path = self.state_dir / "gateway.yaml"
        cfg = gateway_config(
            self.fleet,
            health_interval=self.timing.health_interval,
            drain_timeout=self.timing.drain_timeout,
            url_of=self.placement.url,
        )
        # it may hold the admin token: readable by this user alone
        cfg_path.touch(mode=0o600)
        cfg_path.chmod(0o600)
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        spec = gateway_spec(
            str(cfg_path), self.fleet.gateway.port, "/ready" if routable else "/health"
        )
        self.gateway = Child(spec, logs / "gateway.log")
        self._spawn(self.gateway)
        # in the state at once: replicas may load for minutes, and `down` must find the gateway
        self.write_state("starting")
        if (why := self.gateway.wait_ready(time.monotonic() + 60.0)) is not None:
            raise FleetError(f"gateway: {why}\n{tail(self.gateway.log_path)}")

    def _every_pool_local(self) -> bool:
        """Whether each pool of the fleet has a replica on this host (then the gateway's
        /ready can turn 200 with this host's replicas alone)."""
        local = {r.pool for r in self.placement.local(self.fleet)}
        return bool(local) and local == {r.pool for r in self.fleet.replicas}

    def _start_replicas(
        self,
        specs: list[Spec],
        logs: Path,
        on_ready: Callable[[str], None] | None,
        routable: Callable[[], None],
    ) -> None:
        """Start the replicas, each as soon as those it must follow (sharers of its GPUs) are
        ready; call ``routable`` once a replica of every pool is ready (at once when this host
        has none); return when all are ready."""
        ready: set[str] = set()
        by_name: dict[str, Child] = {}
        pool_of = {r.name: r.pool for r in self.fleet.replicas}
        pools = {pool_of[s.name] for s in specs}
        called = False

        def maybe_routable() -> None:
            nonlocal called
            if not called and pools <= {pool_of[n] for n in ready}:
                called = True
                routable()

        def wait(child: Child, deadline: float) -> None:
            if child.spec.name in ready:
                return
            if (why := child.wait_ready(deadline)) is not None:
                raise FleetError(f"replica {why}\n{tail(child.log_path)}")
            ready.add(child.spec.name)
            if on_ready:
                on_ready(child.spec.name)
            maybe_routable()

        maybe_routable()  # no replica here: the gateway at once
        for spec in specs:
            for name in spec.start_after:
                wait(by_name[name], time.monotonic() + self.timing.ready_timeout)
            child = Child(spec, logs / f"{spec.name}.log")
            self._spawn(child)
            self.replicas.append(child)
            by_name[spec.name] = child
            self.write_state("starting")
        # every replica waited on at once: the first ready of each pool opens the gateway
        deadline = time.monotonic() + self.timing.ready_timeout
        results: queue.Queue[tuple[Child, str | None]] = queue.Queue()
        pending = [c for c in self.replicas if c.spec.name not in ready]
        for c in pending:
            threading.Thread(
                target=lambda c=c: results.put((c, c.wait_ready(deadline))), daemon=True
            ).start()
        for _ in pending:
            child, why = results.get()
            if why is not None:
                raise FleetError(f"replica {why}\n{tail(child.log_path)}")
            wait(child, deadline)

    def _spawn(self, child: Child) -> None:
        try:
            child.start()
        except FileNotFoundError:
            raise FleetError(f"{child.spec.name}: `{child.spec.argv[0]}` was not found") from None
        self._started_at[child.spec.name] = self.clock()

    def start_telemetry(self) -> None:
        """Serve the GPUs' telemetry (engine vllm, NVML); say in one line where, or why not."""
        from servefleet.telemetry.fleet import start_fleet_telemetry

        local = self.placement.local(self.fleet)
        got = start_fleet_telemetry(self.fleet, self.gpu_metrics_port, local)
        if isinstance(got, str):
            self.say(got)
        else:
            self.telemetry = got
            self.say(f"GPU telemetry (NVML) at {got.url}")

    # -- supervise ---------------------------------------------------------------------------
    def check(self) -> None:
        """One supervision tick: note exits, restart what is due (with backoff)."""
        now = self.clock()
        for child in self.children():
            name = child.spec.name
            if child.alive() or child.proc is None:
                continue
            if name not in self._due:
                up_for = now - self._started_at.get(name, now)
                n = 0 if up_for > self.timing.stable_after else self._failures.get(name, 0)
                self._failures[name] = n + 1
                delay = min(self.timing.backoff_max, self.timing.backoff_base * 2**n)
                self._due[name] = now + delay
                self.say(
                    f"{name} exited with code {child.proc.returncode}; restarting in "
                    f"{delay:g} s (log: {child.log_path})"
                )
            elif now >= self._due[name]:
                del self._due[name]
                try:
                    self._spawn(child)
                except FleetError as e:
                    self.say(str(e))
                    continue
                child.restarts += 1
                self.write_state("up")
                self.say(f"restarted {name} (restart {child.restarts}, pid {child.pid})")

    def check_hung(self) -> None:
        """Kill a replica that is alive but not doing its job (``Liveness``); ``check`` then
        restarts it like any replica that exited."""
        now = self.clock()
        if now - self._probed_at < self.timing.health_interval:
            return
        self._probed_at = now
        for child in self.replicas:
            name = child.spec.name
            if not child.alive() or name in self._due:
                continue
            live = self._liveness.get(name)
            if live is None or live.started_at != self._started_at.get(name):
                live = Liveness(self.timing.ready_timeout, self.timing.unhealthy_after)
                live.restarted(self._started_at.get(name, now))
                self._liveness[name] = live
            url = f"http://127.0.0.1:{child.spec.port}{child.spec.health_path}"
            why = live.observe(self.clock(), health_ok(url))
            if why is not None:
                self.say(f"{name}: {why}; killing it to restart it (log: {child.log_path})")
                child.kill()

    def supervise(self, stop: threading.Event, tick: float = 0.5) -> None:
        while not stop.wait(tick):
            self.check()
            self.check_hung()

    # -- stop --------------------------------------------------------------------------------
    def shutdown(self, quiet: bool = False) -> None:
        """Drain: the gateway finishes requests in flight (its drain_timeout), then replicas."""
        if not quiet:
            self.say("draining: gateway first, then the replicas")
        self._due.clear()
        if self.gateway is not None:
            self.gateway.stop(self.timing.drain_timeout + self.timing.kill_timeout)
        for child in self.replicas:
            child.terminate()
        for child in self.replicas:
            child.stop(self.timing.kill_timeout)
        if self.telemetry is not None:
            self.telemetry.close()
            self.telemetry = None
        self.write_state("stopped")
        if self._owns_pid_file:
            (self.state_dir / PID_FILE).unlink(missing_ok=True)
            self._owns_pid_file = False

    def write_state(self, phase: str) -> None:
        write_state(
            self.state_dir,
            {
                "phase": phase,
                "supervisor_pid": os.getpid(),
                "engine": self.fleet.engine,
                "model": self.fleet.model.name,
                "gateway_url": self.gateway_url,
                "gpu_metrics_url": self.telemetry.url if self.telemetry is not None else None,
                "updated": time.time(),
                "processes": [
                    {
                        "name": c.spec.name,
                        "pid": c.pid,
                        "host": c.spec.host,
                        "port": c.spec.port,
                        "health_path": c.spec.health_path,
                        "restarts": c.restarts,
                        "log": str(c.log_path),
                    }
                    for c in self.children()
                ],
                "remote_replicas": [
                    {"name": r.name, "url": self.placement.url(r)}
                    for r in self.placement.remote(self.fleet)
                ],
            },
        )


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join("  | " + t for t in text)
