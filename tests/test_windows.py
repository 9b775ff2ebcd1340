"""A point's window holds a whole burst period after its warm-up (workload.windows), in
simulate and in bench."""

from __future__ import annotations

import pytest

from servefleet.bench.point import PointSettings
from servefleet.bench.runs import whole_burst_period
from servefleet.bench.schedule import StopRule
from servefleet.workload import load_workload
from servefleet.workload.presets import SUMMARY_PERIOD
from servefleet.workload.source import build_groups, nominal_rate
from servefleet.workload.types import Load
from servefleet.workload.windows import burst_period, whole_period_duration


def test_the_burst_period_scales_with_the_rate():
    mix = load_workload("enterprise-mix")
    nominal = nominal_rate(build_groups(mix))
    assert burst_period(mix, None) == pytest.approx(SUMMARY_PERIOD)
    assert burst_period(mix, 3.5) == pytest.approx(SUMMARY_PERIOD * nominal / 3.5)
    assert burst_period(load_workload("chat-3tier"), 3.5) is None  # Poisson: no period


def test_a_short_window_is_extended_to_a_whole_period():
    mix = load_workload("enterprise-mix")
    period = burst_period(mix, 3.5)
    check = whole_period_duration(mix, 3.5, 60.0, 30.0)
    assert check.extended and check.duration >= 30.0 + period > 60.0
    assert "one whole burst period" in check.describe()
    assert not whole_period_duration(mix, 3.5, 30.0 + period + 1, 30.0).extended
    assert whole_period_duration(load_workload("chat-3tier"), 3.5, 60.0, 30.0) is None


def test_bench_extends_an_open_loop_point_and_says_so():
    mix = load_workload("enterprise-mix")
    settings = PointSettings(StopRule(60.0), warmup=5.0, cooldown=2.0)
    longer, note = whole_burst_period(mix, settings, Load(rate=3.5))
    assert longer.stop.duration >= 5.0 + burst_period(mix, 3.5) + 2.0
    assert note and note.startswith("--duration extended from 60 s")
    same, none = whole_burst_period(mix, settings, Load(concurrency=8))  # closed loop: no bursts
    assert same is settings and none is None


def test_bench_keeps_a_short_window_when_asked_and_says_so():
    mix = load_workload("enterprise-mix")
    settings = PointSettings(StopRule(60.0), warmup=5.0)
    same, note = whole_burst_period(mix, settings, Load(rate=3.5), extend=False)
    assert same is settings and "shorter than one burst period" in note
