"""The twin's measured error per regime (plan/model_error.py, data/model_error.json): the data
is what docs/validation.md's tables give, the regime is matched axis by axis, and the error
moves the plan's headroom and the rate where the SLO breaks."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from servefleet.plan.model_error import AXES, breaks_at, load, regime_error, used_share
from servefleet.plan.search import SLOTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "real_vllm"))


def _numbers(data: dict) -> dict:
    return {
        axis: [{k: v for k, v in e.items() if k != "sources"} for e in entries]
        for axis, entries in data["axes"].items()
    }


def test_the_packaged_data_is_what_the_validation_tables_give():
    from model_error import build

    data = load()
    assert data["schema"] == 1 and set(data["axes"]) == set(AXES)
    assert _numbers(build()) == _numbers(data)  # rerun model_error.py --write after a change
    for entries in data["axes"].values():
        for e in entries:
            assert e["validation"] in (
                "held out", "partly held out", "fitted only", "published data", "the base", "none"
            )  # fmt: skip
            assert (e["points"] > 0) == bool(e["sources"]) or e["validation"] == "published data"


def test_the_regime_is_matched_axis_by_axis_and_its_weakest_axis_named():
    light = regime_error(8, 1, "bf16", False)
    assert light.entries["concurrency_per_replica"]["match"] == {"min": 1, "max": 16}
    assert light.validated == "held out"
    heavy = regime_error(200, 4, "fp16", True)
    assert heavy.entries["concurrency_per_replica"]["match"]["min"] == 129
    assert heavy.weakest == ("dtype", "none")
    # past 128 streams the twin's step time is far too low: ITL may be ~1.8x, rate ~0.67x
    assert heavy.itl_factor > 1.5 and heavy.rate_factor < 0.8
    assert heavy.itl_factor > light.itl_factor and heavy.rate_factor < light.rate_factor
    assert "200 requests in flight per replica" in heavy.describe()
    assert regime_error(8, 1, "int8", False).entries["dtype"] is None  # no data: not measured


def _p(rate, ttft, itl=0.05, ok=True):
    return SimpleNamespace(rate=rate, ttft=ttft, itl=itl, ok=ok, slo_class=None)


def test_the_break_with_the_error_comes_before_the_break_without_it():
    slo = SLOTarget()  # TTFT 2 s, ITL 100 ms
    err = regime_error(40, 1, "bf16", False)  # TTFT up to 1/(1-0.15) = 1.18x
    points = [_p(4.0, 1.2), _p(4.6, 1.8), _p(5.07, 3.0, ok=False)]
    assert used_share(points[1], slo.limits_of) == pytest.approx(0.9)
    assert used_share(points[1], slo.limits_of, err) > 1.0  # 1.8 s x 1.18 > 2 s
    at = breaks_at(points, slo.limits_of, err)
    assert 4.0 < at < 4.6  # between the last point that held with the error and the next
    calm = [_p(4.0, 0.5), _p(4.6, 0.6)]
    assert breaks_at(calm, slo.limits_of, err) is None
