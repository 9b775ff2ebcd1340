"""Production trace formats: Mooncake's JSONL (block hashes), Azure's CSV, servefleet's own
records; block sharing without sessions, replayed in the simulator with the plain rule's hits."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from servefleet.engine import Engine, Request, SegmentContent
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import build_replicas, simulate_point
from servefleet.workload import (
    Segment,
    WorkloadError,
    block_reuse,
    build_source,
    describe_workload,
    dry_run,
    load_workload,
    output_key,
    recorded_rate,
)
from servefleet.workload.datasets import load_trace
from servefleet.workload.types import Load

TRACES = Path(__file__).parent / "data" / "traces"
MOONCAKE = TRACES / "mooncake-sample.jsonl"
AZURE = TRACES / "azure-sample.csv"
RECORDS = TRACES / "records-sample.jsonl"


def test_formats_are_told_from_the_file():
    moon, azure, recs = load_trace(MOONCAKE), load_trace(AZURE), load_trace(RECORDS)
    assert len(moon) == 120 and all(r.blocks for r in moon)
    first = json.loads(MOONCAKE.read_text().splitlines()[0])
    assert moon[0].timestamp == first["timestamp"] / 1000  # milliseconds
    assert moon[0].prompt_tokens == first["input_length"]
    assert moon[0].blocks == tuple(first["hash_ids"])
    assert len(azure) == 100 and not any(r.blocks for r in azure)
    row = AZURE.read_text().splitlines()[1].split(",")
    stamp = dt.datetime.fromisoformat(row[0]).replace(tzinfo=dt.UTC).timestamp()
    assert (azure[0].timestamp, azure[0].prompt_tokens) == (stamp, int(row[1]))
    assert (
        len(recs) == 40
        and recs[0].timestamp == json.loads(RECORDS.read_text().split("\n")[0])["scheduled_time"]
    )


def test_mooncake_blocks_become_shared_segments(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
        {"timestamp": 3000, "input_length": 1300, "output_length": 6, "hash_ids": [7, 8]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = load_workload(f"trace:{path}")
    a, b = dry_run(build_source(spec, seed=0), until=1e9)
    assert a.prompt == (
        Segment("h:7", 512, "block"),
        Segment("h:8", 512, "block"),
        Segment("h:9", 76, "block"),  # the last block is partial
    )
    assert b.prompt == (*a.prompt[:2], Segment("u:r000001", 276, "user"))  # past the blocks
    assert (a.arrival_time, b.arrival_time) == (0.0, 2.0) and b.session_id is None
    # the trace's own block size
    small = load_workload(f"trace:{path}", overrides={"trace": {"block_size": 400}})
    a4, _ = dry_run(build_source(small, seed=0), until=1e9)
    assert [s.length for s in a4.prompt] == [400, 400, 300]
    with pytest.raises(WorkloadError, match=r"m\.jsonl:1: 3 hash_ids of 1024 tokens exceed"):
        load_trace(path, block_size=1024)


def test_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "a.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,3\nyesterday,5,1\n"
    )
    with pytest.raises(WorkloadError, match=r"a\.csv:3: TIMESTAMP must be a date-time"):
        load_trace(bad)
    bad.write_text("Time,Tokens\n1,2\n")
    with pytest.raises(WorkloadError, match=r"a\.csv:1: missing column\(s\) TIMESTAMP"):
        load_trace(bad)
    moon = tmp_path / "m.jsonl"
    moon.write_text('{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}\n')
    with pytest.raises(WorkloadError, match=r"m\.jsonl:1: input_length must be an integer >= 1"):
        load_trace(moon)


def test_time_scale_max_requests_and_recorded_rate():
    spec = load_workload(f"trace:{AZURE}")
    recs = spec.trace.records()
    t0 = recs[0].timestamp
    reqs = dry_run(build_source(spec, seed=0), until=1e9)
    assert [r.arrival_time for r in reqs] == [r.timestamp - t0 for r in recs]
    fast = load_workload(
        f"trace:{AZURE}", overrides={"trace": {"time_scale": 0.5, "max_requests": 10}}
    )
    reqs = dry_run(build_source(fast, seed=0), until=1e9)
    assert len(reqs) == 10
    assert [r.arrival_time for r in reqs] == [(r.timestamp - t0) * 0.5 for r in recs[:10]]
    # the default load point of a trace replays it at its recorded times
    again = dry_run(build_source(fast, seed=0, rate=recorded_rate(fast)), until=1e9)
    assert [r.arrival_time for r in again] == pytest.approx(
        [r.arrival_time for r in reqs], abs=1e-9
    )
    assert "10 requests" in describe_workload(fast)


def _h100_7b():
    return resolve_deployment(
        load_model("Qwen2.5-7B"), get_gpu("H100-SXM"), tp=1, max_model_len=8192
    )


def _plain_rule_hits(dep, spec) -> dict[str, int]:
    """Each request's cached prompt tokens under the plain rule: one engine that caches every
    full block (no content of a request held back as its own), stepped by its cost model."""
    engine = Engine(dep.scheduler_config(), dep.cost_model())
    pending = dry_run(build_source(spec, seed=0), until=1e9)
    t, i, hits = 0.0, 0, {}
    while i < len(pending) or engine.has_unfinished:
        if not engine.has_unfinished:
            t = max(t, pending[i].arrival_time)
        while i < len(pending) and pending[i].arrival_time <= t:
            s = pending[i]
            engine.add_request(
                Request(
                    s.request_id,
                    s.prompt_tokens,
                    s.max_tokens,
                    SegmentContent(s.prompt, s.request_id),
                    arrival_time=t,
                )
            )
            i += 1
        step = engine.step()
        for req in step.finished:
            hits[req.request_id] = req.num_cached_tokens
        t += step.duration
    return hits


def test_simulated_prefix_hits_equal_the_plain_rule_and_the_analytic_ratio():
    """Requests share blocks with no session: the simulator caches them as the plain rule does,
    and on a cache that never evicts the hit ratio is the trace's analytic block reuse."""
    dep = _h100_7b()
    spec = load_workload(f"trace:{MOONCAKE}")
    load = Load(rate=recorded_rate(spec))
    res = simulate_point(dep, spec, load, duration=1000, warmup=0)
    records = {r.request_id: r for r in res.records}
    assert len(records) == 120 and all(r.ok for r in records.values())
    assert {k: r.cached_tokens for k, r in records.items()} == _plain_rule_hits(dep, spec)
    analytic = block_reuse(spec.trace.records(), 512)
    assert analytic > 0.5
    assert res.prefix_hit_rate == pytest.approx(analytic, rel=0.01)


def test_fast_path_hits_equal_the_plain_rule_when_requests_overlap():
    """The trace 20 times faster: requests wait on each other and hit blocks while they are
    still being computed; the fast path still gives every request the plain rule's hits."""
    dep = _h100_7b()
    spec = load_workload(f"trace:{MOONCAKE}", overrides={"trace": {"time_scale": 0.05}})

    def hits(fast: bool) -> dict[str, int | None]:
        source = build_source(spec, seed=0)
        sim = ClusterSim(build_replicas(dep), make_policy("round-robin"), source, fast=fast)
        return {r.request_id: r.cached_tokens for r in sim.run(1000.0).records}

    fast, plain = hits(True), hits(False)
    assert len(fast) == 120 and fast == plain
    assert sum(fast.values()) > 0


def test_blocks_are_shared_and_nothing_a_request_owns_is_resent():
    """Block segments are in many prompts; a request's own tail and its answer in none other
    (the contract the fast path trusts, ``fastpath.contract``)."""
    reqs = dry_run(build_source(load_workload(f"trace:{MOONCAKE}"), seed=0), until=1e9)
    holders: dict[str, set[str]] = {}
    for r in reqs:
        for s in r.prompt:
            holders.setdefault(s.key, set()).add(r.request_id)
    blocks = {s.key for r in reqs for s in r.prompt if s.kind == "block"}
    assert sum(len(holders[k]) > 1 for k in blocks) > 20
    for r in reqs:
        own = [s.key for s in r.prompt if s.kind == "user"]
        assert all(holders[k] == {r.request_id} for k in own)
        assert output_key(r.request_id) not in holders
