"""The knee rule (stats.find_knee, docs/metrics.md "Knee"): the seed concurrency curve of the
README, a simulated rate sweep past saturation, and curves that have no knee."""

from __future__ import annotations

import math

import pytest

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import Load, sweep
from servefleet.stats import KneeRule, find_knee
from servefleet.workload import load_workload

# README "The seed scenario": 4 x TP=2 Qwen1.5-14B on 8 x V100, chat-3tier, closed loop.
SEED_CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128]
SEED_OUT_TOK_S = [46, 91, 182, 336, 589, 932, 1342, 1646]
SEED_TTFT_P95_MS = [381.0, 381.0, 381.0, 396.2, 481.5, 703.8, 868.4, 4987]


def test_the_seed_curve_has_its_knee_at_128():
    """64 -> 128 concurrent: +23 % throughput for 5.7x the TTFT P95 — the knee."""
    i = find_knee(SEED_CONCURRENCY, SEED_OUT_TOK_S, SEED_TTFT_P95_MS)
    assert i is not None and SEED_CONCURRENCY[i] == 128
    gain = SEED_OUT_TOK_S[i] / SEED_OUT_TOK_S[i - 1]
    cost = SEED_TTFT_P95_MS[i] / SEED_TTFT_P95_MS[i - 1]
    assert math.log(cost) / math.log(gain) > KneeRule().elasticity


def test_the_rising_part_of_the_curve_is_not_a_knee():
    """Without the saturated point there is no knee: every earlier step bought throughput at
    least as fast as it cost latency."""
    assert find_knee(SEED_CONCURRENCY[:-1], SEED_OUT_TOK_S[:-1], SEED_TTFT_P95_MS[:-1]) is None


@pytest.mark.parametrize(
    ("thr", "ttft", "knee"),
    [
        ([100, 195, 380, 420, 430], [0.2, 0.2, 0.25, 0.9, 3.0], 3),  # +10 % for x3.6
        ([100, 200, 400, 800, 1600], [0.2, 0.2, 0.25, 0.9, 3.0], None),  # doubling each step
        ([100, 200, 300, 300, 290], [0.2, 0.21, 0.3, 0.4, 0.44], None),  # flat, latency steady
        ([100, 200, 300, 300, 290], [0.2, 0.21, 0.3, 0.6, 2.0], 3),  # flat, latency x2
    ],
)
def test_cost_against_gain(thr, ttft, knee):
    assert find_knee([1, 2, 4, 8, 16], thr, ttft) == knee


def test_a_simulated_rate_sweep_past_saturation_has_a_knee():
    """One TP=2 replica of the seed scenario, open-loop rates through its capacity (about 1.35
    req/s): the knee is the first rate past it, where TTFT P95 explodes. The rate before it sits
    far enough below capacity that its TTFT P95 (which climbs steeply there) is no knee."""
    dep = resolve_deployment(
        load_model("Qwen1.5-14B"),
        get_gpu("V100-SXM2-32G"),
        tp=2,
        replicas=1,
        max_model_len=4096,
        max_num_seqs=32,
        max_num_batched_tokens=256,
        gpu_memory_utilization=0.9,
    )
    rates = [0.3, 0.6, 0.85, 1.15, 1.4, 2.7]
    points = sweep(
        dep, load_workload("chat-3tier"), [Load(rate=r) for r in rates], duration=240, warmup=30
    )
    thr = [p.summary.output_throughput for p in points]
    ttft = [p.summary.ttft.p95 for p in points]
    i = find_knee(rates, thr, ttft)
    assert i is not None, list(zip(rates, thr, ttft, strict=True))
    assert 1.0 < rates[i] <= 1.8
    assert ttft[i] > 2 * ttft[i - 1] and thr[i] < 1.25 * thr[i - 1]
