"""servefleet up / status / down: command rendering, clear refusals, and a real fleet of
sim-server processes + the gateway on loopback (ready lines and /health, never a sleep)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from servefleet.fleet.cli import register
from servefleet.fleet.commands import (
    FleetError,
    SimOptions,
    check_ports,
    free_ports,
    gateway_config,
    replica_specs,
    sim_spec,
    vllm_spec,
)
from servefleet.fleet.state import pid_alive, read_state
from servefleet.gateway.config import parse_config
from servefleet.plan.fleet_yaml import Fleet, dump_fleet, load_fleet

RUN = "import sys, typer; from servefleet.fleet.cli import register; app = typer.Typer(); register(app); app(sys.argv[1:])"


def make_fleet(ports: list[int], engine: str = "sim", **over) -> Fleet:
    n = len(ports) - 1
    return Fleet.model_validate(
        {
            "model": {"name": "Qwen2.5-7B", "path": "Qwen/Qwen2.5-7B-Instruct"},
            "engine": engine,
            "gpus": {"type": "H200-SXM", "count": 8},
            "vllm": {"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
            "replicas": [
                {"name": f"replica-{i}", "tp": 2, "gpu_ids": [2 * i, 2 * i + 1], "port": p}
                for i, p in enumerate(ports[:n])
            ],
            "gateway": {"host": "127.0.0.1", "port": ports[n]},
            **over,
        }
    )


def app() -> typer.Typer:
    a = typer.Typer()
    register(a)
    return a


# -- rendering and refusals (no processes) ---------------------------------------------------


def test_vllm_command_pins_gpus_and_carries_the_planned_flags() -> None:
    f = make_fleet([8001, 8002, 8000], engine="vllm")
    spec = vllm_spec(f, f.replicas[1], ["vllm"])
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    argv = spec.argv
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    joined = " ".join(argv)
    for flag in (
        "--tensor-parallel-size 2",
        "--max-model-len 4096",
        "--max-num-seqs 64",
        "--max-num-batched-tokens 2048",
        "--port 8002",
        # what the fleet names first (clients of plain `vllm serve` ask for it), the preset too
        "--served-model-name Qwen/Qwen2.5-7B-Instruct Qwen2.5-7B",
    ):
        assert flag in joined


def test_sim_command_is_a_sim_server_with_the_same_flags() -> None:
    f = make_fleet([8001, 8000])
    argv = sim_spec(f, f.replicas[0], SimOptions(time_scale=4, startup_time=0)).argv
    assert argv[1:3] == ["-m", "servefleet.sim.server"]
    j = " ".join(argv)
    assert "--gpu H200-SXM" in j and "--max-num-seqs 64" in j and "--time-scale 4" in j
    assert "--startup-time 0" in j and "--port 8001" in j


def test_missing_vllm_binary_is_a_clear_message(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(FleetError, match=r"`vllm` was not found on PATH.*engine: sim"):
        replica_specs(make_fleet([8001, 8000], engine="vllm"), SimOptions())


def test_vllm_importable_without_its_script_runs_as_a_module(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = replica_specs(make_fleet([8001, 8000], engine="vllm"), SimOptions())[0]
    assert spec.argv[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def test_replicas_sharing_a_gpu_start_one_after_another() -> None:
    f = make_fleet([8001, 8000])
    one = f.replicas[0].model_copy(update={"tp": 1, "gpu_ids": [0]})
    f = Fleet.model_validate(
        f.model_dump()
        | {
            "vllm": f.vllm.model_dump() | {"gpu_memory_utilization": 0.3},
            "replicas": [
                one.model_dump() | {"name": n, "port": p, "gpu_ids": g}
                for n, p, g in (
                    ("a", 8001, [0]),
                    ("b", 8002, [1]),
                    ("c", 8003, [0]),
                    ("d", 8004, [0]),
                )
            ],
        }
    )
    after = {s.name: s.start_after for s in replica_specs(f, SimOptions())}
    assert after == {"a": (), "b": (), "c": ("a",), "d": ("a", "c")}


def test_replicas_of_other_hosts_are_not_started_here() -> None:
    """They are joined by the gateway instead (tests/test_fleet_hosts.py)."""
    f = make_fleet([8001, 8002, 8000])
    other = f.replicas[1].model_copy(update={"host": "gpu-7"})
    f = f.model_copy(update={"replicas": [f.replicas[0], other]})
    assert [s.name for s in replica_specs(f, SimOptions())] == ["replica-0"]


def test_port_in_use_names_the_field() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        free = free_ports(1)[0]
        with pytest.raises(FleetError, match=rf"port {taken} is in use .*replicas\[0\]\.port"):
            check_ports(make_fleet([taken, free]))


def test_up_refuses_a_bad_fleet_yaml_naming_the_field(tmp_path: Path) -> None:
    p = tmp_path / "fleet.yaml"
    p.write_text(
        dump_fleet(make_fleet([8001, 8000])).replace("max_num_seqs: 64", "max_num_seqs: -1")
    )
    r = CliRunner().invoke(app(), ["up", str(p), "--state-dir", str(tmp_path / "s")])
    assert r.exit_code == 2
    assert "vllm.max_num_seqs" in r.output


def test_gateway_config_lists_every_replica() -> None:
    f = make_fleet([8001, 8002, 8000])
    cfg = gateway_config(f)
    assert [r["url"] for r in cfg["replicas"]] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    parsed = parse_config(cfg)
    assert parsed.port == 8000 and parsed.policy.name == "least-outstanding"


def test_fleet_yaml_gateway_section_is_the_gateway_config(tmp_path: Path) -> None:
    """Every option of the gateway is an option of fleet.yaml's `gateway:`, validated there
    and handed to the gateway as written."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"keys: [{{name: a, sha256: '{'0' * 64}', tier: pro}}]\n")
    gw = {
        "port": 8000,
        "policy": {"name": "length-pools", "options": {"threshold": 900}},
        "stream": {"idle_timeout": 12.5},
        "auth": {"keys_file": "keys.yaml", "required": True},
        "rate_limit": {"requests_per_second": 1, "tiers": {"pro": {"requests_per_second": 9}}},
    }
    text = dump_fleet(make_fleet([8001, 8000])).split("gateway:")[0]
    (tmp_path / "fleet.yaml").write_text(text + yaml.safe_dump({"gateway": gw}))
    f = load_fleet(tmp_path / "fleet.yaml")
    cfg = parse_config(gateway_config(f))
    assert cfg.policy.options == {"threshold": 900} and cfg.stream.idle_timeout == 12.5
    assert cfg.auth.required and cfg.auth.keys_file == str(keys)  # relative to fleet.yaml
    assert cfg.rate_limit.tiers["pro"].requests_per_second == 9
    # a gateway option misspelt is refused naming the file and the field
    (tmp_path / "bad.yaml").write_text(text + "gateway: {port: 8000, strem: {}}\n")
    at = len(text.splitlines()) + 1
    with pytest.raises(ValueError, match=rf"bad\.yaml:{at}: gateway\.strem: Extra inputs"):
        load_fleet(tmp_path / "bad.yaml")
    # a keys file that is not there is refused at load, naming it
    keys.write_text("keys: [\n")
    with pytest.raises(
        ValueError, match=r"fleet.yaml: gateway.auth.keys_file .*keys.yaml:2: invalid"
    ):
        load_fleet(tmp_path / "fleet.yaml")
    keys.unlink()
    with pytest.raises(ValueError, match=r"fleet.yaml: gateway.auth.keys_file .*keys.yaml"):
        load_fleet(tmp_path / "fleet.yaml")


def test_fleet_yaml_errors_name_the_file_the_line_and_the_fix(tmp_path: Path) -> None:
    good = dump_fleet(make_fleet([8001, 8000]))
    lines = good.splitlines()
    gpu_line = next(i for i, line in enumerate(lines, 1) if line.startswith("gpus:"))
    bad = tmp_path / "fleet.yaml"
    bad.write_text(good.replace("type: H200-SXM", "type: H100-SMX"))
    with pytest.raises(ValueError) as e:
        load_fleet(bad)
    assert f"{bad}:{gpu_line}: gpus: type: unknown GPU 'H100-SMX'. Did you mean 'H100-SXM'?" in str(
        e.value
    )
    bad.write_text(good.replace("dtype: auto", "dtype: fp17", 1))
    with pytest.raises(ValueError, match=r"fleet\.yaml:\d+: vllm\.dtype: Input should be 'auto'"):
        load_fleet(bad)
    bad.write_text(good + "  - oops: [\n")
    with pytest.raises(ValueError, match=rf"fleet\.yaml:{len(lines) + 1}: invalid YAML"):
        load_fleet(bad)


def test_status_and_down_without_a_fleet(tmp_path: Path) -> None:
    r = CliRunner().invoke(app(), ["status", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "no fleet state" in r.output
    r = CliRunner().invoke(app(), ["down", "--state-dir", str(tmp_path)])
    assert r.exit_code == 0 and "no `servefleet up` running" in r.output


# -- a real fleet --------------------------------------------------------------------------


class Up:
    def __init__(self, proc: subprocess.Popen, state_dir: Path) -> None:
        self.proc = proc
        self.state_dir = state_dir
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {text!r} in {timeout} s:\n{''.join(self.seen)}") from None
            if line is None:
                raise AssertionError(f"up exited before {text!r}:\n{''.join(self.seen)}")
            self.seen.append(line)
            if text in line:
                return line


def spawn_up(fleet_file: Path, state: Path, *flags: str) -> subprocess.Popen:
    """`servefleet up` as a process of its own (fast sim replicas, a short drain)."""
    cmd = [sys.executable, "-c", RUN, "up", str(fleet_file), "--state-dir", str(state),
           "--startup-time", "0.5", "--drain-timeout", "5", *flags]  # fmt: skip
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        start_new_session=True,
    )


def kill_up(proc: subprocess.Popen, state: Path) -> None:
    """Whatever is left of an `up` and the processes it started."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    st = read_state(state) or {}
    for p in st.get("processes", []):
        if p.get("pid") and pid_alive(p["pid"]):
            os.killpg(p["pid"], signal.SIGKILL)


@contextmanager
def fleet_up(tmp: Path, n: int) -> Iterator[tuple[Up, Fleet]]:
    fleet = make_fleet(free_ports(n + 1))
    (tmp / "fleet.yaml").write_text(dump_fleet(fleet))
    state = tmp / "state"
    proc = spawn_up(tmp / "fleet.yaml", state)
    try:
        yield Up(proc, state), fleet
    finally:
        kill_up(proc, state)


def _pids(state_dir: Path) -> list[int]:
    return [p["pid"] for p in read_state(state_dir)["processes"]]


def test_up_status_restart_and_down_from_another_terminal(tmp_path: Path) -> None:
    runner = CliRunner()
    with fleet_up(tmp_path, 2) as (up, fleet):
        up.expect("fleet up:")
        state = up.state_dir
        r = runner.invoke(app(), ["status", "--state-dir", str(state), "--json"])
        assert r.exit_code == 0, r.output
        st = json.loads(r.output)
        assert [p["name"] for p in st["processes"]] == ["replica-0", "replica-1", "gateway"]
        assert all(p["alive"] and p["ready"] for p in st["processes"]), st
        for name in ("replica-0", "replica-1", "gateway"):
            assert (state / "logs" / f"{name}.log").stat().st_size > 0
        # a request through the gateway
        import urllib.request

        body = json.dumps({"model": "Qwen2.5-7B", "prompt": "hello there", "max_tokens": 4})
        req = urllib.request.Request(
            f"http://127.0.0.1:{fleet.gateway.port}/v1/completions",
            body.encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["usage"]["completion_tokens"] == 4
        # a crashed replica is restarted (with backoff)
        victim = _pids(state)[0]
        os.killpg(victim, signal.SIGKILL)
        up.expect("replica-0 exited with code -9; restarting in 1 s")
        up.expect("restarted replica-0 (restart 1")
        pids = _pids(state)
        assert pids[0] != victim
        # down from another terminal: drains, every process ends
        r = runner.invoke(app(), ["down", "--state-dir", str(state), "--timeout", "30"])
        assert r.exit_code == 0 and "stopped the fleet" in r.output, r.output
        assert up.proc.wait(30) == 0
        assert not any(pid_alive(p) for p in pids)
        up.expect("fleet stopped")


def test_ctrl_c_drains_and_stops_everything(tmp_path: Path) -> None:
    with fleet_up(tmp_path, 1) as (up, _):
        up.expect("fleet up:")
        pids = _pids(up.state_dir)
        # a second `up` on the same state dir is refused
        r = CliRunner().invoke(
            app(), ["up", str(tmp_path / "fleet.yaml"), "--state-dir", str(up.state_dir)]
        )
        assert r.exit_code == 2 and "already up" in r.output
        os.kill(up.proc.pid, signal.SIGINT)
        up.expect("draining")
        assert up.proc.wait(30) == 0
        assert not any(pid_alive(p) for p in pids)
        assert not (up.state_dir / "up.pid").exists()


def test_restart_backoff_doubles_up_to_the_cap_and_resets_once_stable(tmp_path: Path) -> None:
    from servefleet.fleet.commands import Spec
    from servefleet.fleet.proc import Child
    from servefleet.fleet.supervisor import Supervisor, Timing

    now = [0.0]
    said: list[str] = []
    sup = Supervisor(
        make_fleet([8001, 8000]),
        tmp_path,
        timing=Timing(backoff_base=1.0, backoff_max=4.0, stable_after=60.0),
        say=said.append,
        clock=lambda: now[0],
    )
    child = Child(
        Spec("replica-0", [sys.executable, "-c", "raise SystemExit(3)"], 1), tmp_path / "r.log"
    )
    sup.replicas.append(child)
    try:
        sup._spawn(child)
        delays = []
        for step in range(5):
            child.proc.wait(30)
            if step == 4:
                now[0] += 100.0  # it ran for a long while before this exit: backoff resets
            sup.check()
            m = re.search(r"exited with code 3; restarting in (\S+) s", said[-1])
            assert m, said
            delays.append(float(m.group(1)))
            now[0] += delays[-1] - 0.01
            sup.check()
            assert "restarted" not in said[-1]  # not yet due
            now[0] += 0.01
            sup.check()
            assert said[-1].startswith(f"restarted replica-0 (restart {step + 1}")
        assert delays == [1.0, 2.0, 4.0, 4.0, 1.0]
        assert read_state(tmp_path)["processes"][0]["restarts"] == 5
    finally:
        child.stop(5)


def test_up_with_vllm_missing_says_so(tmp_path: Path, monkeypatch) -> None:
    p = tmp_path / "fleet.yaml"
    p.write_text(dump_fleet(make_fleet(free_ports(2), engine="vllm")))
    monkeypatch.setenv("PATH", "/nonexistent")
    r = CliRunner().invoke(app(), ["up", str(p), "--state-dir", str(tmp_path / "s")])
    assert r.exit_code == 2 and "`vllm` was not found on PATH" in r.output


def test_a_replica_that_cannot_start_stops_the_start_with_its_log(tmp_path: Path) -> None:
    fleet = make_fleet(free_ports(2))
    fleet = fleet.model_copy(
        update={"model": fleet.model.model_copy(update={"name": "NoSuchModel"})}
    )
    p = tmp_path / "fleet.yaml"
    p.write_text(dump_fleet(fleet))
    state = tmp_path / "s"
    r = CliRunner().invoke(app(), ["up", str(p), "--state-dir", str(state)])
    assert r.exit_code == 2, r.output
    assert "replica-0 exited with code" in r.output and "NoSuchModel" in r.output
    assert not any(pid_alive(p) for p in _pids(state))
    assert not (state / "up.pid").exists()


def test_vllm_engine_runs_the_vllm_serve_line_pinned_to_its_gpus(
    tmp_path: Path, monkeypatch
) -> None:
    """A stand-in `vllm` on PATH (a sim-server taking the same flags) runs the exact
    `vllm serve` line; readiness is /health alone (vLLM prints no ready line)."""
    from servefleet.fleet.supervisor import Supervisor, Timing

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$CUDA_VISIBLE_DEVICES $*" > {tmp_path}/argv-$$\n'
        "shift\n"  # `serve`
        f'exec {sys.executable} -m servefleet.sim.server "$@" --startup-time 0.3 > /dev/null\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    fleet = make_fleet(free_ports(2), engine="vllm")
    sup = Supervisor(fleet, tmp_path / "state", timing=Timing(ready_timeout=60, drain_timeout=2))
    try:
        sup.start()
        assert sup.replicas[0].spec.ready_marker is None
        (line,) = [p.read_text() for p in tmp_path.glob("argv-*")]
        assert line.startswith("0,1 serve Qwen/Qwen2.5-7B-Instruct ")
        assert f"--port {fleet.replicas[0].port}" in line and "--tensor-parallel-size 2" in line
    finally:
        sup.shutdown(quiet=True)
    assert not any(c.alive() for c in sup.children())


def test_vllm_replicas_sharing_a_gpu_start_after_the_first_is_ready(
    tmp_path: Path, monkeypatch
) -> None:
    """Two vLLM replicas on one GPU (0.45 of its memory each): the second `vllm serve`
    starts only once the first answers /health (vLLM profiles free memory at start-up)."""
    from servefleet.fleet.supervisor import Supervisor, Timing

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(
        "#!/bin/sh\n"
        f"date +%s.%N > {tmp_path}/started-$$\n"
        "shift\n"
        f'exec {sys.executable} -m servefleet.sim.server "$@" --startup-time 0.5 > /dev/null\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    p1, p2, pg = free_ports(3)
    base = make_fleet([p1, pg], engine="vllm")
    one = base.replicas[0].model_dump() | {"tp": 1, "gpu_ids": [0]}
    fleet = Fleet.model_validate(
        base.model_dump()
        | {
            "vllm": base.vllm.model_dump() | {"gpu_memory_utilization": 0.45},
            "replicas": [one | {"name": "a", "port": p1}, one | {"name": "b", "port": p2}],
        }
    )
    ready_at: dict[str, float] = {}
    sup = Supervisor(fleet, tmp_path / "state", timing=Timing(ready_timeout=60, drain_timeout=2))
    try:
        sup.start(on_ready=lambda name: ready_at.setdefault(name, time.time()))
        starts = sorted(float(p.read_text()) for p in tmp_path.glob("started-*"))
        assert len(starts) == 2
        assert starts[0] < ready_at["a"] <= starts[1] < ready_at["b"]
    finally:
        sup.shutdown(quiet=True)
    assert not any(c.alive() for c in sup.children())


def test_gateway_opens_while_a_slow_replica_still_loads(tmp_path: Path, monkeypatch) -> None:
    """One replica of two loads for ten minutes: `up` starts the gateway once the other is
    ready, and the gateway's /ready answers 200 naming the one still loading."""
    p_fast, p_slow, p_gw = free_ports(3)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(
        "#!/bin/sh\n"
        "shift\n"
        f'case "$*" in *"--port {p_slow} "*|*"--port {p_slow}") T=600 ;; *) T=0.3 ;; esac\n'
        f'exec {sys.executable} -m servefleet.sim.server "$@" --startup-time $T > /dev/null\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (tmp_path / "fleet.yaml").write_text(dump_fleet(make_fleet([p_fast, p_slow, p_gw], "vllm")))
    state = tmp_path / "state"
    proc = spawn_up(tmp_path / "fleet.yaml", state, "--gpu-metrics-port", "0")
    try:
        up = Up(proc, state)
        up.expect("ready: replica-0")
        up.expect("ready: gateway")
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{p_gw}/ready", timeout=10) as r:
            body = json.loads(r.read())
        assert r.status == 200 and body["ready_replicas"] == ["replica-0"]
        assert body["missing"] == ["replica-1"]
        assert not any("ready: replica-1" in line for line in up.seen)
        # the gateway is in the state while the slow replica loads: `down` can stop it
        assert "gateway" in {p["name"] for p in read_state(state)["processes"]}
    finally:
        kill_up(proc, state)
