"""Bench pieces that need no socket, no clock and no event loop."""

from __future__ import annotations

import pytest

from servefleet.bench.client import spread
from servefleet.bench.prompts import PromptRenderer, synthetic_text
from servefleet.bench.schedule import Schedule, StopRule
from servefleet.bench.scrape import ClientTokens, histogram_delta, parse_metrics, server_delta
from servefleet.bench.search import SloSearch
from servefleet.records import RequestRecord
from servefleet.stats import SLO, Window, error_kind, evaluate, meets_slo, summarize
from servefleet.workload import RequestSpec, Segment, build_source, fixed_workload, output_key


def test_stop_rule_by_duration_and_count():
    assert StopRule(duration=10).done(10.0, 0) and not StopRule(duration=10).done(9.99, 10**6)
    assert StopRule(max_requests=3).done(0.0, 3) and not StopRule(max_requests=3).done(99, 2)
    with pytest.raises(ValueError, match="needs a stop"):
        StopRule()


def test_schedule_merges_initial_and_follow_ups_in_time_order():
    src = build_source(fixed_workload(10, 5), seed=0, concurrency=2)
    s = Schedule(src)
    a, b = s.pop(), s.pop()
    assert (a.arrival_time, b.arrival_time) == (0.0, 0.0) and s.peek() is None
    assert s.finished(a, 1.5, 5) == 1  # the closed loop's next request, at the finish time
    assert s.peek().arrival_time == 1.5
    open_loop = Schedule(build_source(fixed_workload(10, 5), seed=0, rate=4.0))
    times = [open_loop.pop().arrival_time for _ in range(50)]
    assert times == sorted(times) and 8 < 50 / times[-1] * 2 < 12 * 2


def test_slo_search_doubles_then_bisects():
    s = SloSearch(start=1.0, tolerance=0.1)
    capacity = 11.0
    while (r := s.next_rate()) is not None:
        s.report(r, r <= capacity)
    assert [r for r, _ in s.steps[:5]] == [1, 2, 4, 8, 16]
    assert 10.0 <= s.result <= capacity and (s.failed - s.passed) / s.failed <= 0.1
    low = SloSearch(start=8.0)
    while (r := low.next_rate()) is not None:
        low.report(r, r <= 3.0)
    assert low.steps[:3] == [(8.0, False), (4.0, False), (2.0, True)] and 2.7 <= low.result <= 3.0


def test_spread_tokens_over_chunks_by_text_length():
    assert spread(5, [5, 15, 5]) == [1, 3, 1]  # 5-character tokens
    assert spread(10, [5, 15, 5]) == [2, 6, 2]
    assert sum(spread(10, [3, 3, 3])) == 10
    assert spread(3, [1, 100, 1]) == [1, 1, 1]  # at least one each
    assert sum(spread(2, [5, 5, 5, 5])) == 2


def test_equal_keys_render_identical_text_and_answers_are_substituted():
    r = PromptRenderer()
    sys_seg = Segment("sys:x:0", 30, "system")
    spec = RequestSpec("r1", "c", (sys_seg, Segment("u:r1", 20)), 8, 0.0)
    spec2 = RequestSpec("r2", "c", (sys_seg, Segment("u:r2", 20)), 8, 0.0)
    m1, m2 = r.messages(spec), r.messages(spec2)
    assert m1[0].content == m2[0].content and len(m1[0].content.split()) == 30
    assert m1[1].content != m2[1].content
    assert synthetic_text("k", 5) == synthetic_text("k", 5)
    r.remember_answer(output_key("r1"), "what the server said")
    turn = RequestSpec(
        "r1.1",
        "c",
        (Segment("u:r1", 20), Segment(output_key("r1"), 4, "answer"), Segment("u:x", 3)),
        8,
        1.0,
    )
    roles = [(m.role, m.content) for m in r.messages(turn)]
    assert (
        roles[1] == ("assistant", "what the server said") and roles[0][0] == roles[2][0] == "user"
    )
    assert PromptRenderer(tokens_per_word=2.0).words_for(100) == 50


def test_renderers_of_different_points_share_no_text():
    """Point 2 of a sweep sends the same workload (same seed) as point 1: its text must differ,
    or it would hit the prefix cache point 1 filled (seen on real vLLM: 27 % hits)."""
    seg = Segment("u:r1", 40)
    spec = RequestSpec("r1", "c", (seg,), 8, 0.0)
    p1, p1_again, p2 = (PromptRenderer(namespace=n) for n in ("run/0/", "run/0/", "run/1/"))
    assert p1.prompt(spec) == p1_again.prompt(spec)
    a, b = p1.prompt(spec).split(), p2.prompt(spec).split()
    assert len(a) == len(b) == 40 and a[:4] != b[:4]


METRICS_A = """# HELP x
vllm:num_preemptions_total{engine="0",model_name="m"} 2
vllm:num_preemptions_total{engine="1",model_name="m"} 1
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.2",model_name="m"} 0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0
"""


def test_server_metrics_deltas_peaks_and_histogram_percentiles():
    a = parse_metrics(METRICS_A)
    assert a[("vllm:num_preemptions_total", "")] == 3  # summed over engines
    b_text = (
        METRICS_A.replace("} 2\n", "} 7\n")
        .replace(
            'queries_total{engine="0",model_name="m"} 1000',
            'queries_total{engine="0",model_name="m"} 3000',
        )
        .replace(
            'hits_total{engine="0",model_name="m"} 100',
            'hits_total{engine="0",model_name="m"} 1100',
        )
        .replace(
            'prompt_tokens_total{engine="0",model_name="m"} 1000',
            'prompt_tokens_total{engine="0",model_name="m"} 3200',
        )
        .replace('le="0.1",model_name="m"} 0', 'le="0.1",model_name="m"} 50')
        .replace('le="0.2",model_name="m"} 0', 'le="0.2",model_name="m"} 100')
        .replace('le="+Inf",model_name="m"} 0', 'le="+Inf",model_name="m"} 100')
        .replace(
            'seconds_count{engine="0",model_name="m"} 0',
            'seconds_count{engine="0",model_name="m"} 100',
        )
        .replace(
            'seconds_sum{engine="0",model_name="m"} 0', 'seconds_sum{engine="0",model_name="m"} 12'
        )
    )
    b = parse_metrics(b_text)
    mid = parse_metrics(
        METRICS_A.replace(
            'perc{engine="0",model_name="m"} 0.1', 'perc{engine="0",model_name="m"} 0.8'
        )
    )
    v = server_delta(a, b, [mid], ClientTokens(2200, 300))
    assert v.preemptions == 5 and v.prefix_hit_rate == pytest.approx(0.5)
    assert v.peak_kv_usage == pytest.approx(0.8)
    # vLLM counts no recomputed token: with preemptions the ratio is unknown (never 0), and
    # bounded by 5 preemptions x the longest context (300) over the 2200 prompt tokens computed
    assert v.reprefill is None and v.reprefill_max == pytest.approx(1500 / (2200 + 1500))
    assert server_delta(a, a, [], ClientTokens(0, 300)).reprefill == 0.0  # no preemption: 0
    h = histogram_delta(a, b, "vllm:time_to_first_token_seconds")
    assert h.count == 100 and h.mean == pytest.approx(0.12)
    assert h.p50 == pytest.approx(0.1) and h.p95 == pytest.approx(0.19)


def rec(i, scheduled, sent, ok=True, error=None) -> RequestRecord:
    return RequestRecord(
        f"r{i}",
        "c",
        scheduled,
        sent,
        first_token_time=sent + 0.1,
        end_time=sent + 0.5,
        chunk_times=[sent + 0.1, sent + 0.5],
        chunk_tokens=[1, 1],
        output_tokens=2,
        status="ok" if ok else "error",
        error=error,
    )


def test_selfcheck_warns_loudly_when_the_client_lags():
    good = [rec(i, i * 0.1, i * 0.1 + 0.0005) for i in range(100)]
    c = evaluate(good, Window(0, 10), [0.0005] * 100, 0.2, open_loop=True)
    assert not c.client_bound and c.offered_rate == pytest.approx(10) and c.send_lag_p99 < 0.001
    late = [rec(i, i * 0.1, i * 0.1 + 0.02) for i in range(100)]
    c = evaluate(late, Window(0, 10), [0.03] * 100, 0.97, open_loop=True, ttft_p50=0.1)
    assert c.client_bound and len(c.warnings) == 3  # 20-30 ms of lag next to a 100 ms TTFT
    assert any("send-schedule lag" in w for w in c.warnings) and any("CPU" in w for w in c.warnings)
    # the same lags beside a 22 s TTFT and 1 s token gaps do not matter: notes, not a verdict
    c = evaluate(late, Window(0, 10), [0.03] * 100, 0.97, open_loop=True, ttft_p50=22, itl_p50=1)
    assert not c.client_bound and len(c.notes) == 3 and "22,000.0 ms" in c.notes[0]


def test_error_kinds_and_slo_test():
    rs = [
        rec(0, 0, 0),
        rec(1, 0, 0, False, "HTTP 429: busy"),
        rec(2, 0, 0, False, "HTTP 429: x"),
        rec(3, 0, 0, False, "connect: cannot reach"),
        rec(4, 0, 0, False, "aborted: interrupted"),
    ]
    assert [error_kind(r) for r in rs[1:]] == ["HTTP 429", "HTTP 429", "connect", "aborted"]
    s = summarize(rs, Window(0, 10))
    assert s.error_kinds == {"HTTP 429": 2, "connect": 1, "aborted": 1}
    assert not meets_slo(s, SLO())  # 80 % errors
    ok = summarize([rec(i, i, i) for i in range(10)], Window(0, 20))
    assert meets_slo(ok, SLO(ttft=0.2, itl=0.5)) and not meets_slo(ok, SLO(ttft=0.05, itl=0.5))
