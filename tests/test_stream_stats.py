"""Streaming summaries (stream_stats.py) against ``stats.summarize`` on the same records."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.records import RequestRecord
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import build_replicas
from servefleet.stats import CANCELLED, SLO, Window, summarize
from servefleet.stream_stats import RELATIVE_ACCURACY, Quantiles, SummaryStream, tokens_in_window
from servefleet.workload import build_source, load_workload


def _stream(records, window, slo=None):
    s = SummaryStream(window, slo)
    for r in records:
        s.add(r)
    return s


def test_equals_summarize_on_a_simulated_run_with_rejections_and_preemptions():
    dep = resolve_deployment(
        load_model("Qwen1.5-14B"),
        get_gpu("V100-SXM2-32G"),
        tp=2,
        num_gpus=4,
        max_model_len=2048,  # some enterprise-mix summaries do not fit: rejected
        gpu_memory_utilization=0.6,
    )
    source = build_source(load_workload("enterprise-mix"), seed=1, rate=40.0)
    res = ClusterSim(build_replicas(dep), make_policy("least-outstanding"), source).run(30)
    recs = res.records
    assert any(not r.ok for r in recs) and any(r.preemptions for r in recs)
    for window in (Window(5.0, 30.0), Window(0.0, 1e9), Window(12.0, 13.0)):
        slo = SLO(ttft=0.5, itl=0.05)
        s = _stream(recs, window, slo)
        assert s.exact
        assert s.summary() == summarize(recs, window, slo)


def rec(rid, send, chunks, status="ok", **kw):
    times = [t for t, _ in chunks]
    toks = [k for _, k in chunks]
    return RequestRecord(
        rid,
        kw.pop("class_name", "c"),
        send,
        send,
        first_token_time=times[0] if times else None,
        end_time=times[-1] if times else None,
        chunk_times=times,
        chunk_tokens=toks,
        prompt_tokens=10,
        output_tokens=sum(toks),
        status=status,
        **kw,
    )


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 10),
            st.lists(st.tuples(st.floats(0.001, 1), st.integers(1, 4)), max_size=6),
            st.sampled_from(["ok", "ok", "error", "cancelled"]),
            st.one_of(st.none(), st.integers(0, 5)),
            st.sampled_from(["a", "b"]),
            st.integers(0, 11),
        ),
        max_size=14,
    ),
    st.floats(0, 8),
    st.floats(0.5, 10),
)
def test_equals_summarize_on_any_records(specs, start, length):
    recs = []
    for i, (send, gaps, status, n, cls, turn) in enumerate(specs):
        t, chunks = send, []
        for g, k in gaps if status == "ok" else []:
            t += g
            chunks.append((t, k))
        error = {"ok": None, "error": "HTTP 429", "cancelled": CANCELLED}[status]
        recs.append(
            rec(
                f"r{i}",
                send,
                chunks,
                "aborted" if status == "cancelled" else status,
                error=error,
                cached_tokens=n,
                preemptions=n,
                recomputed_tokens=n,
                class_name=cls,
                turn=turn,
            )
        )
    w = Window(start, start + length)
    slos = {"b": SLO(ttft=0.3, itl=None)}
    s = SummaryStream(w, SLO(), slos)
    for r in recs:
        s.add(r)
    assert s.summary() == summarize(recs, w, SLO(), class_slos=slos)


def test_tokens_in_window_counts_chunks_that_arrived_inside():
    r = rec("a", 0.0, [(0.5, 1), (0.6, 2), (0.9, 3)])
    assert tokens_in_window(r, Window(0.0, 0.7)) == 3
    assert tokens_in_window(r, Window(0.6, 0.9)) == 2
    assert tokens_in_window(r, Window(0.0, 1.0)) == 6
    assert tokens_in_window(r, Window(1.0, 2.0)) == 0


@pytest.mark.parametrize("scale", [1e-3, 1.0])
def test_sketch_percentiles_are_within_the_relative_accuracy(scale):
    rng = np.random.default_rng(0)
    values = rng.lognormal(0, 1.5, 200_000) * scale
    values[:50] = 0.0  # zeros are counted apart
    q = Quantiles(exact_values=1000)
    q.extend(values[:150_000])
    for v in values[150_000:]:
        q.add(float(v))
    assert not q.exact
    d = q.distribution()
    s = np.sort(values)
    assert d.count == values.size and d.max == s[-1]
    assert d.mean == pytest.approx(values.mean(), rel=1e-9)
    for p, got in ((50, d.p50), (90, d.p90), (95, d.p95), (99, d.p99)):
        want = s[math.floor(p / 100 * (values.size - 1))]
        assert abs(got - want) <= RELATIVE_ACCURACY * want * (1 + 1e-9)


def test_exact_until_the_limit():
    q = Quantiles(exact_values=3)
    for v in (3.0, 1.0, 2.0):
        q.add(v)
    assert q.exact and q.distribution().p50 == 2.0
    q.add(4.0)
    assert not q.exact and q.distribution().count == 4
