"""The gateway's Kubernetes discovery (gateway/discovery.py): the pure mapping from
EndpointSlices to replicas, and a real gateway process discovering real sim-servers from a fake
API server (tests/fake_k8s_api.py) over loopback.

The EndpointSliceLists in tests/data/k8s/ are in the API's format (checked below against the
Kubernetes 1.37 schema): a headless Service of three pods, the third still loading (not ready);
then the second terminating. For the live test their pod addresses are rewritten to loopback
addresses and their port to the sim-servers' (every pod on its own address, the same port)."""

from __future__ import annotations

import copy
import json
import re
import socket
import sys
import urllib.request
from contextlib import ExitStack
from functools import cache
from importlib.resources import files
from pathlib import Path

import jsonschema
import openai
import yaml
from referencing import Registry, Resource

from live_helpers import GATEWAY_READY, served, spawn, start_sim, wait_line, wait_until
from servefleet.gateway.discovery import ServiceSource, replicas_from_slices

DATA = Path(__file__).parent / "data" / "k8s"
SERVICE = "qwen2-5-7b-tp2-default"
PODS = [f"{SERVICE}-{i}" for i in range(3)]
LOOPBACK = {"10.244.1.17": "127.0.0.2", "10.244.2.9": "127.0.0.3", "10.244.2.11": "127.0.0.4"}


def _recorded(name: str) -> dict:
    return json.loads((DATA / f"endpointslices-{name}.json").read_text())


@cache
def _list_schema() -> jsonschema.Draft202012Validator:
    import kubernetes_validate

    root = files(kubernetes_validate) / "kubernetes-json-schema" / "v1.37.0-local-strict"
    defs = Resource.from_contents(json.loads((root / "_definitions.json").read_text()))
    schema = json.loads((root / "endpointslicelist-discovery-v1.json").read_text())
    return jsonschema.Draft202012Validator(schema, registry=defs @ Registry())


def test_recorded_slices_are_in_the_apis_format() -> None:
    for name in ("before", "after"):
        errors = [e.message for e in _list_schema().iter_errors(_recorded(name))]
        assert errors == [], (name, errors)


def test_replicas_from_slices_one_per_pod_named_after_it() -> None:
    source = ServiceSource(
        service=SERVICE, replica={"pool": "default", "max_in_flight": 12, "tp": 2}
    )
    reps = replicas_from_slices(_recorded("before"), source)
    assert [(r.name, r.url, r.pool, r.max_in_flight, r.tp) for r in reps] == [
        (PODS[0], "http://10.244.1.17:8000", "default", 12, 2),
        (PODS[1], "http://10.244.2.9:8000", "default", 12, 2),
        (PODS[2], "http://10.244.2.11:8000", "default", 12, 2),  # loading: health decides
    ]
    assert [r.name for r in replicas_from_slices(_recorded("before"), source, True)] == PODS[:2]
    # a terminating pod is dropped (the gateway drains it)
    assert [r.name for r in replicas_from_slices(_recorded("after"), source)] == [PODS[0], PODS[2]]


def test_replicas_from_slices_ports_addresses_and_duplicates() -> None:
    data = _recorded("before")
    by_number = ServiceSource(service=SERVICE, port=8000)
    assert len(replicas_from_slices(data, by_number)) == 3
    assert replicas_from_slices(data, ServiceSource(service=SERVICE, port="grpc")) == []
    v6 = copy.deepcopy(data)
    v6["items"][0]["addressType"] = "IPv6"
    v6["items"][0]["endpoints"][0]["addresses"] = ["fd00::17"]
    del v6["items"][0]["endpoints"][0]["targetRef"]
    v6["items"].append(copy.deepcopy(data["items"][0]))  # the same pods in a second slice
    reps = replicas_from_slices(v6, ServiceSource(service=SERVICE))
    names = [r.name for r in reps]
    assert f"{SERVICE}-fd00::17" in names and len(names) == len(set(names)) == 4
    assert next(r.url for r in reps if r.name == f"{SERVICE}-fd00::17") == "http://[fd00::17]:8000"


def _free_port_on(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _on_loopback(data: dict, port: int) -> dict:
    data = copy.deepcopy(data)
    for s in data["items"]:
        s["ports"][0]["port"] = port
        for ep in s["endpoints"]:
            ep["addresses"] = [LOOPBACK[a] for a in ep["addresses"]]
    return data


def _fleet(gw: str) -> dict[str, dict]:
    reps = json.loads(urllib.request.urlopen(gw + "/fleet", timeout=5).read())["replicas"]
    return {r["name"]: r for r in reps if r["state"] != "draining"}


def test_gateway_discovers_replicas_from_the_kubernetes_api(tmp_path: Path) -> None:
    with ExitStack() as stack:
        port = _free_port_on("127.0.0.2")
        sims = {}
        for pod, host in zip(PODS, LOOPBACK.values(), strict=True):
            loading = ["--startup-time", "3600"] if pod == PODS[2] else []
            sims[pod] = f"http://{host}:{port}"
            start_sim(tmp_path, pod, stack, *loading, host=host, port=port)
        slices = tmp_path / "slices.json"
        slices.write_text(json.dumps(_on_loopback(_recorded("before"), port)))
        (tmp_path / "token").write_text("pod-token-1\n")
        api_log = tmp_path / "api.log"
        api = spawn(
            [sys.executable, str(Path(__file__).parent / "fake_k8s_api.py"), str(slices),
             "pod-token-1"], api_log, stack,
        )  # fmt: skip
        api_port = wait_line(api, re.compile(r"ready: port=(\d+)"), api_log)
        cfg = {
            "host": "127.0.0.1",
            "port": 0,
            "policy": {"name": "round-robin"},  # sequential requests: to each in turn
            "health": {"interval": 0.2, "healthy_threshold": 1},
            "discovery": {
                "kubernetes": {
                    "api_url": f"http://127.0.0.1:{api_port}",
                    "namespace": "serving",
                    "token_file": str(tmp_path / "token"),
                    "ca_file": None,
                    "interval": 0.2,
                    "services": [
                        {
                            "service": SERVICE,
                            "port": "http",
                            "replica": {
                                "pool": "default",
                                "max_in_flight": 4,
                                "model": "Qwen2.5-7B",
                            },
                        }
                    ],
                }
            },
        }
        (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(cfg))
        gw_log = tmp_path / "gateway.log"
        gw_proc = spawn(
            [sys.executable, "-m", "servefleet.gateway", "--config", str(tmp_path / "gateway.yaml")],
            gw_log, stack,
        )  # fmt: skip
        gw = f"http://127.0.0.1:{wait_line(gw_proc, GATEWAY_READY, gw_log)}"

        # every pod is a replica of its own (named after it, its address, the cap); the
        # loading one is known but gets no traffic until its /health answers 200
        def healthy() -> dict | None:
            f = _fleet(gw)
            ok = set(f) == set(PODS) and [f[p]["health"] for p in PODS][:2] == ["healthy"] * 2
            return f if ok else None

        f = wait_until(healthy, "two healthy discovered replicas")
        assert {p: (f[p]["url"], f[p]["max_in_flight"]) for p in PODS} == {
            p: (sims[p], 4) for p in PODS
        }
        assert f[PODS[2]]["health"] != "healthy"
        client = openai.OpenAI(base_url=gw + "/v1", api_key="k", max_retries=0)

        def send(n: int) -> list[float]:
            before = [served(sims[p]) for p in PODS[:2]]
            for _ in range(n):
                r = client.completions.create(model="Qwen2.5-7B", prompt="hello", max_tokens=2)
                assert r.usage.completion_tokens == 2
            return [served(sims[p]) - b for p, b in zip(PODS[:2], before, strict=True)]

        assert all(d > 0 for d in send(12))  # routed to each ready pod

        # the cluster changes: pod 1 terminates -> the gateway drains it, traffic goes to pod 0
        slices.write_text(json.dumps(_on_loopback(_recorded("after"), port)))
        wait_until(lambda: set(_fleet(gw)) == {PODS[0], PODS[2]}, "pod 1 dropped")
        assert send(6) == [6, 0]

        # the API server goes away: the replicas found stay, and keep serving
        api.kill()
        api.wait(10)
        wait_until(lambda: "discovery_failed" in gw_log.read_text(), "a failed poll")
        assert set(_fleet(gw)) == {PODS[0], PODS[2]}
        assert send(3) == [3, 0]
