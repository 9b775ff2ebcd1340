"""Do two versions of the simulator give the same results? Run scenarios, dump everything.

``python benchmarks/sim_equivalence.py --out DIR`` runs every scenario and writes each one's
records, per-step logs and engine counters to ``DIR/<scenario>.json.gz`` (and prints a digest);
``--compare A B`` compares two such folders field by field (exact, else the largest relative
difference of any float). Run it once with the old code on ``PYTHONPATH`` and once with the new;
``--plain`` runs the plain engine rule instead of the fast path (``sim.replicas``): the digests
must be the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim, SimResult
from servefleet.sim.deployment import Deployment, resolve_deployment
from servefleet.sim.runner import build_replicas
from servefleet.workload import build_source, load_workload


def seed_fleet(**kw) -> Deployment:
    return resolve_deployment(
        load_model("Qwen1.5-14B"),
        get_gpu("V100-SXM2-32G"),
        tp=2,
        num_gpus=kw.pop("num_gpus", 8),
        max_model_len=4096,
        max_num_seqs=256,
        **kw,
    )


def h200_7b(**kw) -> Deployment:
    return resolve_deployment(
        load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), tp=1, max_model_len=8192, **kw
    )


SHARED_SYSTEM_PROMPT = {
    "classes": {
        "qa": {"system_prompt": {"tokens": 600, "share": 0.8, "groups": 3}},
        "summaries": {"system_prompt": {"tokens": 300, "share": 0.5, "groups": 2, "name": "doc"}},
    }
}


FAST = True
"""Whether the scenarios run the fast path (``--plain``: the plain rule)."""


def _run(dep: Deployment, workload, *, minutes: float, sync: bool = False, **load) -> SimResult:
    spec = (
        load_workload(workload[0], overrides=workload[1])
        if isinstance(workload, tuple)
        else (load_workload(workload))
    )
    replicas = build_replicas(dep)
    if sync:
        for r in replicas:
            r.config = dataclasses.replace(r.config, async_scheduling=False)
    source = build_source(spec, seed=load.pop("seed", 0), **load)
    sim = ClusterSim(replicas, make_policy("least-outstanding"), source, fast=FAST)
    return sim.run(minutes * 60)


SCENARIOS: dict[str, Callable[[], SimResult]] = {
    "seed-closed-512": lambda: _run(seed_fleet(), "chat-3tier", minutes=10, concurrency=512),
    "seed-open-25": lambda: _run(seed_fleet(), "chat-3tier", minutes=5, rate=25.0),
    "seed-enterprise-shared": lambda: _run(
        seed_fleet(), ("enterprise-mix", SHARED_SYSTEM_PROMPT), minutes=4, rate=30.0
    ),
    "overload-preempt": lambda: _run(
        seed_fleet(num_gpus=2, gpu_memory_utilization=0.8),
        "chat-3tier",
        minutes=3,
        concurrency=400,
    ),
    "h200-7b-async": lambda: _run(h200_7b(), "chat-3tier", minutes=3, rate=40.0),
    "h200-7b-enterprise-sync": lambda: _run(
        h200_7b(enable_prefix_caching=True), "enterprise-mix", minutes=3, sync=True
    ),
    "h200-7b-nocache-shared": lambda: _run(
        h200_7b(
            enable_prefix_caching=False, replicas_per_gpu=2, num_gpus=1, gpu_memory_utilization=0.45
        ),
        ("enterprise-mix", SHARED_SYSTEM_PROMPT),
        minutes=2,
        rate=60.0,
    ),
}


def _log(log) -> dict:
    """A replica's step log: the columns every version has, and the peak KV usage (versions
    before quiet runs kept a column of it, and of the batch's shape, which nothing read)."""
    kept = {name: list(getattr(log, name)) for name in ("start", "end", "delivered")}
    peak = getattr(log, "peak_kv_usage", None)
    kept["peak_kv_usage"] = max(log.kv_usage, default=0.0) if peak is None else peak
    return kept


def dump(res: SimResult) -> dict:
    return {
        "records": [dataclasses.asdict(r) for r in res.records],
        "end_time": res.end_time,
        "replicas": [
            {
                "name": r.name,
                "log": _log(r.log),
                "counters": dataclasses.asdict(r.engine.counters),
                "prefix_stats": dataclasses.asdict(r.engine.prefix_stats),
            }
            for r in res.replicas
        ],
    }


def digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _diff(a, b, path: str, worst: list) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            worst.append((math.inf, f"{path}: keys differ"))
            return
        for k in a:
            _diff(a[k], b[k], f"{path}.{k}", worst)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            worst.append((math.inf, f"{path}: length {len(a)} vs {len(b)}"))
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", worst)
    elif isinstance(a, float) and isinstance(b, float):
        if a != b:
            worst.append((abs(a - b) / max(abs(a), abs(b)), f"{path}: {a!r} vs {b!r}"))
    elif a != b:
        worst.append((math.inf, f"{path}: {a!r} vs {b!r}"))


def compare(dir_a: Path, dir_b: Path) -> bool:
    same = True
    for fa in sorted(dir_a.glob("*.json.gz")):
        fb = dir_b / fa.name
        a = json.loads(gzip.decompress(fa.read_bytes()))
        b = json.loads(gzip.decompress(fb.read_bytes()))
        worst: list = []
        _diff(a, b, "", worst)
        name = fa.name.removesuffix(".json.gz")
        if not worst:
            print(f"{name}: identical ({len(a['records'])} records)")
            continue
        same = False
        worst.sort(key=lambda w: -w[0])
        print(f"{name}: {len(worst)} differences, largest relative {worst[0][0]:.3g}")
        for w in worst[:5]:
            print(f"    {w[1]}")
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--compare", nargs=2, type=Path)
    ap.add_argument("--plain", action="store_true", help="run the plain engine rule")
    args = ap.parse_args()
    global FAST
    FAST = not args.plain
    if args.compare:
        raise SystemExit(0 if compare(*args.compare) else 1)
    for name, run in SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        t0 = time.process_time()
        res = run()
        cpu = time.process_time() - t0
        data = dump(res)
        preempt = sum(r.engine.counters.preemptions for r in res.replicas)
        hits = sum(r.engine.prefix_stats.hits for r in res.replicas)
        print(
            f"{name}: {digest(data)}  {len(res.records)} records, {preempt} preemptions, "
            f"{hits} prefix-hit tokens, {cpu:.2f} s CPU"
        )
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{name}.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))


if __name__ == "__main__":
    main()
