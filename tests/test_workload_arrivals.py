"""Arrival processes: rates, gap shapes, exact schedules, no drift."""

from itertools import islice

import numpy as np
import pytest

from servefleet.workload.arrivals import Bursts, Constant, Gamma, Poisson, Ramp


def take(process, n, seed=7):
    return np.array(list(islice(process.times(np.random.default_rng(seed)), n)))


def test_poisson_rate_and_exponential_gaps():
    t = take(Poisson(5.0), 20_000)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.all(gaps >= 0)
    assert len(t) / t[-1] == pytest.approx(5.0, rel=0.03)  # a wrong rate is off by far more
    cv2 = gaps.var() / gaps.mean() ** 2
    assert cv2 == pytest.approx(1.0, abs=0.08)
    assert np.mean(gaps > gaps.mean()) == pytest.approx(np.exp(-1), abs=0.02)  # memoryless tail


def test_gamma_burstiness_is_cv2():
    for cv2 in (0.25, 4.0):
        t = take(Gamma(8.0, cv2), 50_000)
        gaps = np.diff(t)
        assert len(t) / t[-1] == pytest.approx(8.0, rel=0.05)
        assert gaps.var() / gaps.mean() ** 2 == pytest.approx(cv2, rel=0.12)


def test_gamma_with_burstiness_one_is_poisson_like():
    gaps = np.diff(take(Gamma(3.0, 1.0), 20_000))
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1.0, abs=0.08)


def test_constant_is_an_absolute_schedule():
    t = take(Constant(10.0), 1_000_001)
    assert t[999] == 99.9  # the 1000th arrival, exactly
    assert t[1_000_000] == 100_000.0  # a million steps later, still no drift
    assert t[0] == 0.0


def test_bursts_are_exact():
    t = take(Bursts(120, 300.0), 360)
    assert list(t) == [0.0] * 120 + [300.0] * 120 + [600.0] * 120
    assert Bursts(120, 300.0).rate == pytest.approx(0.4)


def test_deterministic_ramp_counts_and_holds():
    ramp = Ramp(1.0, 21.0, 100.0, poisson=False)
    t = take(ramp, 3000)
    assert np.all(np.diff(t) >= 0)
    in_ramp = np.sum(t < 100.0)
    assert in_ramp == pytest.approx(100 * (1 + 21) / 2, abs=1)  # ∫ rate dt = 1100
    early, late = np.sum(t < 10), np.sum((t >= 90) & (t < 100))
    assert late > 5 * early
    after = t[(t >= 100) & (t < 110)]
    assert len(after) == pytest.approx(21 * 10, abs=1)  # holds at end_rate


def test_poisson_ramp_matches_the_integral_and_can_end():
    t = take(Ramp(0.0, 40.0, 50.0), 10_000)
    assert np.sum(t < 50.0) == pytest.approx(1000, rel=0.1)
    down = list(Ramp(10.0, 0.0, 20.0, poisson=False).times(np.random.default_rng(0)))
    assert len(down) == 101 and down[-1] == pytest.approx(20.0)  # s = 0..100, then stops


def test_scaling_keeps_the_shape():
    assert Poisson(2.0).scaled(3.0).rate == 6.0
    assert Gamma(2.0, 4.0).scaled(0.5) == Gamma(1.0, 4.0)
    b = Bursts(120, 300.0).scaled(2.0)
    assert (b.count, b.period) == (120, 150.0)
    assert Ramp(1.0, 3.0, 10.0).scaled(2.0).rate == 4.0


def test_same_seed_same_times():
    assert np.array_equal(take(Poisson(3.0), 100, seed=1), take(Poisson(3.0), 100, seed=1))
    assert not np.array_equal(take(Poisson(3.0), 100, seed=1), take(Poisson(3.0), 100, seed=2))
