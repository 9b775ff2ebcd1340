"""`servefleet up` across hosts (fleet/hosts.py): each host starts its own replicas, one
gateway joins them all. The live test runs two `up` processes on this machine as two "hosts":
127.0.0.1 (localhost, with the gateway) and 127.0.0.2 (replicas only)."""

from __future__ import annotations

import json
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest
import typer
from typer.testing import CliRunner

from live_helpers import served, wait_until
from servefleet.fleet.cli import register
from servefleet.fleet.commands import (
    FleetError,
    SimOptions,
    check_ports,
    free_ports,
    gateway_config,
    replica_specs,
)
from servefleet.fleet.hosts import Placement
from servefleet.fleet.supervisor import Supervisor
from servefleet.plan.fleet_yaml import Fleet, dump_fleet
from test_fleet import Up, kill_up, spawn_up


def two_host_fleet(
    ports: list[int], b_host: str = "127.0.0.2", only_b: bool = False, a_host: str = "localhost"
) -> Fleet:
    """Replicas a0, a1 on `a_host` and b0, b1 on `b_host` (each TP=1 on GPUs 0 and 1 of its
    host), the gateway on `ports[4]`; `only_b`: the replicas-only half of host B."""
    reps = [
        {"name": f"{h}{i}", "host": host, "tp": 1, "gpu_ids": [i], "port": ports[2 * k + i]}
        for k, (h, host) in enumerate((("a", a_host), ("b", b_host)))
        for i in range(2)
    ]
    return Fleet.model_validate(
        {
            "model": {"name": "Qwen2.5-7B", "path": "Qwen/Qwen2.5-7B-Instruct"},
            "engine": "sim",
            "gpus": {"type": "H200-SXM", "count": 2},
            "vllm": {"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
            "replicas": reps[2:] if only_b else reps,
            "gateway": {"host": "127.0.0.1", "port": ports[4], "policy": "round-robin",
                        "max_in_flight_per_replica": 8},
        }
    )  # fmt: skip


def test_this_hosts_replicas_are_started_the_others_joined() -> None:
    fleet = two_host_fleet([8001, 8002, 8001, 8002, 8000], b_host="gpu-b")  # same ports: ok
    here = Placement(hostnames=("gpu-a",))
    assert [s.name for s in replica_specs(fleet, SimOptions(), here)] == ["a0", "a1"]
    cfg = gateway_config(fleet, url_of=here.url)
    assert [(r["name"], r["url"], r["max_in_flight"]) for r in cfg["replicas"]] == [
        ("a0", "http://127.0.0.1:8001", 8),
        ("a1", "http://127.0.0.1:8002", 8),
        ("b0", "http://gpu-b:8001", 8),  # another host's: by its name, health-checked
        ("b1", "http://gpu-b:8002", 8),
    ]
    # one file for both hosts names every host (`localhost` is wherever the file is run):
    # on host B (its name given, or its own hostname) it starts b0, b1, which listen on
    # every interface (a name may resolve to a loopback address there)
    shared = two_host_fleet([8001, 8002, 8001, 8002, 8000], b_host="gpu-b", a_host="gpu-a")
    assert [s.name for s in replica_specs(shared, SimOptions(), here)] == ["a0", "a1"]
    for there in (Placement(("gpu-b",)), Placement(hostnames=("gpu-b",))):
        specs = replica_specs(shared, SimOptions(), there)
        assert [s.name for s in specs] == ["b0", "b1"]
        assert all(s.argv[s.argv.index("--host") + 1] == "0.0.0.0" for s in specs)
    # an IP address as host: the replica listens on that address
    ip = two_host_fleet([8001, 8002, 8003, 8004, 8000])
    specs = replica_specs(ip, SimOptions(), Placement(("127.0.0.2",)))
    assert [(s.name, s.argv[s.argv.index("--host") + 1], s.host) for s in specs] == [
        ("a0", "127.0.0.1", "127.0.0.1"),
        ("a1", "127.0.0.1", "127.0.0.1"),
        ("b0", "127.0.0.2", "127.0.0.2"),
        ("b1", "127.0.0.2", "127.0.0.2"),
    ]


def test_a_host_with_nothing_to_start_is_refused(tmp_path: Path) -> None:
    fleet = two_host_fleet([8001, 8002, 8003, 8004, 8000], b_host="gpu-b", only_b=True)
    sup = Supervisor(fleet, tmp_path, placement=Placement(), with_gateway=False)
    with pytest.raises(FleetError, match="nothing to start here"):
        sup.start()
    check_ports(fleet, Placement(), gateway=False)  # nothing of this host's to check


def _up(tmp: Path, name: str, fleet: Fleet, stack: ExitStack, *flags: str) -> Up:
    path = tmp / f"fleet-{name}.yaml"
    path.write_text(dump_fleet(fleet))
    state = tmp / f"state-{name}"
    proc = spawn_up(path, state, *flags)
    stack.callback(kill_up, proc, state)
    return Up(proc, state)


def test_two_ups_serve_through_one_gateway(tmp_path: Path) -> None:
    ports = free_ports(5)
    whole = two_host_fleet(ports)
    urls = {r.name: f"http://{'127.0.0.1' if r.host == 'localhost' else r.host}:{r.port}"
            for r in whole.replicas}  # fmt: skip
    app = typer.Typer()
    register(app)
    with ExitStack() as stack:
        # host B: its half of the fleet, no gateway
        b = _up(tmp_path, "b", two_host_fleet(ports, only_b=True), stack,
                "--this-host", "127.0.0.2", "--no-gateway")  # fmt: skip
        line = b.expect("fleet up:")
        assert "2 replica(s) on this host (no gateway here" in line
        # host A: its replicas, and the gateway in front of all four
        a = _up(tmp_path, "a", whole, stack)
        line = a.expect("fleet up:")
        assert "with 2 replica(s) of other hosts" in line
        gw = f"http://127.0.0.1:{whole.gateway.port}"

        def healthy() -> list[str]:
            reps = json.loads(urllib.request.urlopen(gw + "/fleet", timeout=5).read())["replicas"]
            return sorted(r["name"] for r in reps if r["health"] == "healthy")

        wait_until(lambda: healthy() == sorted(urls), "all four replicas healthy at the gateway")
        client = openai.OpenAI(base_url=gw + "/v1", api_key="k", max_retries=0)

        def send(n: int) -> dict[str, float]:
            before = {k: served(u) for k, u in urls.items() if k.startswith("a") or b_up}
            for _ in range(n):
                r = client.completions.create(model="Qwen2.5-7B", prompt="hi", max_tokens=2)
                assert r.usage.completion_tokens == 2
            return {k: served(urls[k]) - v for k, v in before.items()}

        b_up = True
        assert send(8) == {"a0": 2, "a1": 2, "b0": 2, "b1": 2}  # round robin over both hosts
        st = CliRunner().invoke(app, ["status", "--state-dir", str(a.state_dir)])
        assert "replicas of other hosts, joined by the gateway: b0" in st.output, st.output
        st = CliRunner().invoke(app, ["status", "--state-dir", str(b.state_dir), "--json"])
        assert all(p["ready"] for p in json.loads(st.output)["processes"]), st.output

        # host B goes down: the gateway ejects its replicas, host A serves alone
        r = CliRunner().invoke(app, ["down", "--state-dir", str(b.state_dir), "--timeout", "30"])
        assert r.exit_code == 0, r.output
        b_up = False
        wait_until(lambda: healthy() == ["a0", "a1"], "the gateway to eject host B's replicas")
        assert send(6) == {"a0": 3, "a1": 3}
        r = CliRunner().invoke(app, ["down", "--state-dir", str(a.state_dir), "--timeout", "30"])
        assert r.exit_code == 0 and a.proc.wait(30) == 0


def test_the_16_gpu_2_host_fleet_of_docs_up_md() -> None:
    """The worked fleet.yaml of docs/up.md is valid, splits 4 + 4 between its hosts, and
    exports to Kubernetes as 8 replicas on 2 nodes."""
    import re

    import yaml

    from servefleet.fleet.export import compose, k8s
    from servefleet.fleet.export_compose import ComposeError
    from servefleet.plan.fleet_yaml import parse_fleet

    text = (Path(__file__).parent.parent / "docs" / "up.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "gpu-b" in b]
    fleet = parse_fleet(block, "docs/up.md")
    on_a = Placement(hostnames=("gpu-a",))
    assert [r.name for r in on_a.local(fleet)] == ["a-0", "a-1", "a-2", "a-3"]
    assert [on_a.url(r) for r in on_a.remote(fleet)][:1] == ["http://gpu-b:8001"]
    assert sum(r.tp for r in fleet.replicas) == 16
    docs = list(yaml.safe_load_all(k8s(fleet)))
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    assert sts["spec"]["replicas"] == 8
    with pytest.raises(ComposeError, match="2 hosts"):  # one compose file runs on one host
        compose(fleet)
