"""The uncertainty band (plan/band.py): directions from the cost model, the corners, the scaled
band and the flip test — on the V100 seed deployments and on hand-made screening results."""

from __future__ import annotations

from servefleet.hardware import get_gpu, parameter_bands
from servefleet.models import load_model
from servefleet.plan.band import (
    CORNERS,
    TopologyBand,
    UncertaintyBand,
    _matters,
    corner_values,
    sensitivities,
)
from servefleet.plan.profile import load_any_workload, profile_workload
from servefleet.plan.search import Candidate, CandidateResult
from servefleet.plan.sustainable import fallback, finalists
from servefleet.sim.deployment import resolve_deployment
from test_plan_search import outcome


def dep(tp: int, gpu: str = "V100-SXM2-32G"):
    return resolve_deployment(
        load_model("Qwen1.5-14B"), get_gpu(gpu), tp=tp, replicas=8 // tp, max_model_len=4096,
        max_num_seqs=64, max_num_batched_tokens=512, gpu_memory_utilization=0.9,
    )  # fmt: skip


def result(d, rates_ok: dict[float, bool]) -> CandidateResult:
    c = Candidate(f"{d.replicas} x TP={d.tp}", "planner flags", d, None, "least-outstanding")
    return CandidateResult(c, [outcome(r, ok) for r, ok in rates_ok.items()])


def test_every_unmeasured_v100_figure_has_a_direction_and_the_corners_bracket_nominal():
    profile = profile_workload(load_any_workload("chat-3tier"))
    two, four = dep(2), dep(4)
    params = sensitivities(two.gpu, two, four, profile)
    assert {p.name for p in params} == set(parameter_bands(two.gpu))
    by = {p.name: p for p in params}
    # a faster GEMM or decode attention raises the estimate; a longer step overhead lowers it
    assert by["efficiency.attn_decode_bw"].chosen[1] > 1 > by["efficiency.attn_decode_bw"].chosen[0]
    assert (
        by["efficiency.step_overhead_s"].chosen[1]
        <= 1
        <= by["efficiency.step_overhead_s"].chosen[0]
    )
    corners = corner_values(params)
    assert set(corners) == set(CORNERS)
    for name, p in by.items():
        assert {corners["optimistic"][name], corners["pessimistic"][name]} <= {
            p.band.low,
            p.band.high,
        }
    assert (
        corners["optimistic"]["efficiency.attn_decode_bw"]
        == by["efficiency.attn_decode_bw"].band.high
    )
    assert (
        corners["pessimistic"]["efficiency.step_overhead_s"]
        == by["efficiency.step_overhead_s"].band.high
    )


def test_a_single_gpu_replica_does_not_feel_the_interconnect():
    assert not _matters(dep(1, "H200-SXM"), {"interconnect.latency_s": 1e-3})
    assert _matters(dep(2, "H200-SXM"), {"interconnect.latency_s": 1e-3})
    assert _matters(dep(1), {"efficiency.gemm_max": 0.5})


def test_the_band_scales_the_sustained_rate_and_flags_a_flip():
    two, four = dep(2), dep(4)
    a = TopologyBand("4 x TP=2", level=4.6, nominal_screened=5.0)
    b = TopologyBand("2 x TP=4", level=5.0, nominal_screened=5.5)
    a.corners = {
        "favours chosen": result(two, {5.5: True}),
        "favours runner-up": result(two, {4.5: True}),
    }
    b.corners = {
        "favours chosen": result(four, {5.0: True}),
        "favours runner-up": result(four, {6.6: True}),
    }
    band = UncertaintyBand("V100-SXM2-32G", [], {}, a, b)
    assert a.scaled("favours chosen") == 4.6 * 5.5 / 5.0
    assert band.ratio() == 5.0 / 4.6
    lo, hi = band.ratio_range()
    assert lo < 1 < hi and band.can_flip  # 2 x TP=4 ahead at nominal, behind at one corner
    b.corners["favours chosen"] = result(four, {6.0: True})
    assert band.overlap and band.can_flip  # 4.14 - 5.06 and 5.0 - 6.0: not settled
    b.level = 6.0
    b.corners = {c: result(four, {5.5 * 1.3: True}) for c in b.corners}
    assert not band.overlap and not band.can_flip  # 4.14 - 5.06 vs 6.0 - 7.8: it holds


def test_every_corner_counts_and_a_corner_where_no_rate_holds_is_zero():
    two = dep(2)
    a = TopologyBand("4 x TP=2", level=4.6, nominal_screened=5.0)
    a.corners = {
        "optimistic": result(two, {5.5: True}),
        "pessimistic": result(two, {3.0: False, 2.0: False}),
        "favours runner-up": result(two, {4.5: True}),
    }
    assert a.scaled("pessimistic") == 0.0 and a.scaled("favours chosen") is None
    assert a.range() == (0.0, 4.6 * 5.5 / 5.0)
    assert a.worst_corner() == ("pessimistic", 0.0)
    a.corners["pessimistic"] = result(two, {4.0: True})
    assert a.worst_corner() == ("pessimistic", 4.6 * 4.0 / 5.0)


def test_the_long_runs_decide_and_equal_rates_go_to_more_headroom():
    from servefleet.plan.planner import pick_sustained
    from servefleet.plan.search import SLOTarget

    four_by_two = result(dep(2), {4.17: True, 4.37: False})  # more replicas, lower rate
    two_by_four = result(dep(4), {4.37: True, 4.6: False})
    best, why = pick_sustained([four_by_two, two_by_four], SLOTarget())
    assert best is two_by_four and "4.37 req/s on long runs, the highest" in why
    calm = result(dep(2), {4.37: True})
    calm.points[0].ttft, calm.points[0].itl = 0.5, 0.05  # 75 % of the TTFT SLO left
    busy = result(dep(4), {4.37: True})
    busy.points[0].ttft, busy.points[0].itl = 1.8, 0.05  # 10 % left
    best, why = pick_sustained([busy, calm], SLOTarget())
    assert best is calm and "more latency headroom" in why


def test_finalists_are_the_choice_and_the_best_other_splits():
    r2, r4, r8 = (result(dep(t), {5.0 + t / 10: True}) for t in (2, 4, 8))
    failed = result(dep(1), {4.0: False})
    assert finalists([failed, r2, r4, r8], r2) == [r2, r8, r4]


class _Settings:
    long_window, long_e2e_multiple, long_warmup = 300.0, 10.0, 60.0


class _Runner:
    settings = _Settings()


def test_a_failed_verification_falls_back_to_the_next_finalist_that_held():
    r2, r4 = result(dep(2), {4.6: True, 5.0: False}), result(dep(4), {5.1: True})
    searched = [r2, r4]
    nxt = fallback(_Runner(), None, None, [r2, r4], searched, {r2.candidate.label})
    assert nxt is not None and nxt.chosen is r4 and "next finalist" in nxt.reason
    both = {r2.candidate.label, r4.candidate.label}
    assert fallback(_Runner(), None, None, [r2, r4], searched, both) is None
