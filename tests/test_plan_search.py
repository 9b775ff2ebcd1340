"""The planner's rate search, on synthetic SLO outcomes (no simulation)."""

from __future__ import annotations

import math

from servefleet.plan.search import FUTILE, Outcome, RateSearch, nice
from servefleet.stats import summarize


def outcome(rate: float, ok: bool, miss: float = 0.5) -> Outcome:
    return Outcome(
        rate=rate,
        duration=1.0,
        warmup=0.0,
        summary=summarize([]),
        ttft=1.0,
        itl=0.05,
        ok=ok,
        why="",
        miss_share=0.0 if ok else miss,
        peak_kv_usage=0.0,
        prefix_hit_rate=None,
        max_in_flight=0,
        per_class={},
        wall=0.0,
    )


def run(search: RateSearch, holds) -> list[float]:
    rates = []
    while (r := search.propose()) is not None:
        rates.append(r)
        search.record(outcome(r, holds(r), miss=min(1.0, r / 100)))
    return rates


def test_doubles_then_bisects_to_the_tolerance():
    s = RateSearch(1.0, rel_tol=0.1, min_rate=0.05, max_rate=1e4)
    rates = run(s, lambda r: r <= 3.7)
    assert rates[:3] == [1.0, 2.0, 4.0]
    assert s.lo <= 3.7 < s.hi and s.hi / s.lo <= 1.1
    assert all(r == nice(r) for r in rates) and len(set(rates)) == len(rates)


def test_halves_from_a_start_that_is_too_high():
    s = RateSearch(20.0, rel_tol=0.1, min_rate=0.05, max_rate=1e4)
    rates = run(s, lambda r: r <= 3.7)
    assert rates[:4] == [20.0, 10.0, 5.0, 2.5]
    assert s.lo <= 3.7 < s.hi and s.hi / s.lo <= 1.1


def test_gives_up_at_the_lowest_rate():
    s = RateSearch(1.0, rel_tol=0.1, min_rate=0.3, max_rate=1e4)
    rates = run(s, lambda r: False)
    assert s.lo is None and min(rates) >= 0.3 and not s.futile


def test_stops_halving_when_lower_rates_do_not_help():
    s = RateSearch(8.0, rel_tol=0.1, min_rate=0.01, max_rate=1e4)
    rates = []
    while (r := s.propose()) is not None:
        rates.append(r)
        s.record(outcome(r, False, miss=0.2))  # the same share misses at every rate
    assert rates == [8.0, 4.0] and s.futile
    s = RateSearch(8.0, rel_tol=0.1, min_rate=0.01, max_rate=1e4)
    s.record(outcome(8.0, False, miss=0.2))
    s.record(outcome(4.0, False, miss=0.2 * (1 - FUTILE) - 0.01))  # improving: keep going
    assert not s.futile and s.propose() == 2.0


def test_one_step_down_then_give_up_and_accelerating_growth():
    s = RateSearch(5.0, rel_tol=0.1, min_rate=0.01, max_rate=1e4, grow=1.1, max_down=1)
    assert run(s, lambda r: False) == [5.0, 4.55]
    s = RateSearch(1.0, rel_tol=0.1, min_rate=0.01, max_rate=1e4, grow=1.1, accelerate=True)
    rates = run(s, lambda r: r <= 2.0)
    assert rates[:4] == [1.0, 1.1, nice(1.1 * 1.21), nice(nice(1.1 * 1.21) * 1.1**4)]
    assert s.lo <= 2.0 < s.hi and s.hi / s.lo <= 1.1


def test_prune_stops_a_bracket_below_the_bar():
    s = RateSearch(1.0, rel_tol=0.01, min_rate=0.01, max_rate=1e4)
    s.record(outcome(1.0, True))
    s.record(outcome(2.0, False))
    s.prune(1.5)  # hi 2.0 is above the bar: keep bisecting
    assert s.propose() == nice(math.sqrt(2.0))
    s.prune(2.0)
    assert s.propose() is None
