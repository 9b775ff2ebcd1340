"""The planner's answer holds in production: the sustainability criterion on
hand-made records, then whole plans whose printed rate is re-run for 15 simulated minutes on a
seed the plan never used (benchmarks/plan_sustainability.py runs seeds 1-3 for three cases).

The two whole-plan tests take ~25-40 s each on two cores: they are the acceptance check of the
planner's main promise, and they assert the criterion (SLO, finished share), never a rate — an
engine-model calibration may move the rate, not the promise."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from servefleet.plan import sustain
from servefleet.plan.planner import PlanRequest, make_plan
from servefleet.plan.report import render_group
from servefleet.plan.search import SearchSettings
from servefleet.records import RequestRecord
from servefleet.stats import Window

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from plan_sustainability import check, rerun_args
from test_plan import simulate_process

# ---- the criterion, on records --------------------------------------------------------------


def records(waits: list[float], *, rate: float = 1.0) -> list[RequestRecord]:
    """One request per 1/rate s, each waiting ``waits[i]`` s for its first token, 1 s after."""
    out = []
    for i, w in enumerate(waits):
        t = i / rate
        out.append(
            RequestRecord(
                f"r{i}",
                "c",
                t,
                t,
                first_token_time=t + w,
                end_time=t + w + 1.0,
                chunk_times=[t + w, t + w + 1.0],
                chunk_tokens=[1, 1],
                prompt_tokens=10,
                output_tokens=2,
            )
        )
    return out


def test_theil_sen_is_the_median_pairwise_slope_and_ignores_a_spike():
    assert sustain.theil_sen([0, 1, 2, 3, 4]) == 1.0
    assert sustain.theil_sen([1, 1, 1, 50, 1, 1, 1]) == 0.0  # one burst is no trend
    assert sustain.theil_sen([]) == 0.0


def test_a_queue_that_climbs_is_a_trend_and_a_level_one_is_not():
    w = Window(0.0, 600.0)
    level = sustain.trend(records([2.0] * 600), w)
    assert not level.rising and abs(level.growth) < 1e-9
    assert np.allclose(level.means, 2.0, atol=0.1)  # 2 s wait x 1 req/s = 2 waiting
    climbing = sustain.trend(records([0.02 * i for i in range(600)]), w)  # wait grows 1.2 s/min
    assert climbing.rising and climbing.growth > climbing.bound
    assert "grows" in climbing.describe()


def test_finished_share_counts_what_ended_inside_the_window():
    w = Window(0.0, 100.0)
    recs = records([1.0] * 100)  # every request ends 2 s after it is sent
    assert sustain.finished_share(recs, w) == pytest.approx(0.98)
    slow = records([30.0] * 100)  # ends 31 s after: the last 31 are still running at 100 s
    assert sustain.finished_share(slow, w) == pytest.approx(0.69)


def test_the_tail_of_a_bursty_window_is_whole_periods():
    w = Window(60.0, 60.0 + 6 * 100.0)
    assert sustain.tail_window(w) == Window(460.0, 660.0)
    assert sustain.tail_window(w, period=100.0) == Window(460.0, 660.0)  # 2 of 6 periods
    w2 = Window(60.0, 60.0 + 2 * 300.0)
    assert sustain.tail_window(w2, period=300.0) == Window(360.0, 660.0)  # 1 of 2, not a third


# ---- whole plans, re-run for 15 minutes on a fresh seed ---------------------------------------


def rerun(plan, seed: int, tmp: Path) -> tuple[bool, str]:
    """The plan's own "reproduce" line as a process, at --duration 900 --warmup 60."""
    simulate_process(rerun_args(plan.simulate_command, seed), tmp, timeout=300)
    point = json.loads((tmp / "summary.json").read_text())["points"][0]
    return check(point["summary"], plan.request.slo.ttft, plan.request.slo.itl)


@pytest.fixture(scope="module")
def seed_plan():
    """The seed case, exactly as `servefleet plan` with no options plans it."""
    return make_plan(PlanRequest())


def test_the_seed_plans_rate_holds_for_15_minutes_on_a_fresh_seed(seed_plan, tmp_path):
    sus = seed_plan.sustainability
    assert sus is not None and sus.ok
    assert seed_plan.point.rate == sus.rate and "--duration" in seed_plan.simulate_command
    ok, text = rerun(seed_plan, 1, tmp_path)
    assert ok, text
    if sus.headroom is not None:  # the break is above the recommendation
        assert sus.headroom > sus.rate


def test_the_seed_plan_states_its_band_and_whether_tp2_vs_tp4_can_flip(seed_plan):
    band = seed_plan.band
    assert band is not None and not band.measured  # the V100's efficiencies are assumed
    names = {p.name for p in band.parameters}
    assert {"efficiency.gemm_max", "interconnect.allreduce_eff"} <= names
    lo, hi = band.chosen.range()
    assert lo < band.chosen.level <= hi or lo <= band.chosen.level < hi
    assert band.runner_up is not None and band.ratio_range() is not None
    out = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    out.print(render_group(seed_plan))
    text = out.export_text()
    assert "what the prediction rests on" in text and "band " in text
    assert "the bands overlap" in text or "the ranking holds" in text
    assert ("the ranking holds" in text) == (not band.can_flip)
    if band.can_flip:
        bench = [c for c in seed_plan.settle if c.startswith("servefleet bench")]
        serve = [c for c in seed_plan.settle if "vllm serve" in c]
        assert len(bench) == len(serve) == 2
        tps = {band.chosen.label.split("TP=")[1][0], band.runner_up.label.split("TP=")[1][0]}
        assert {s.split("--tensor-parallel-size ")[1][0] for s in serve} == tps


def test_the_recommended_rate_holds_at_the_pessimistic_end_of_the_band(seed_plan, tmp_path):
    """The rate the plan recommends, re-run by its printed `servefleet simulate` line with the
    band's lowest corner (--gpu-param), meets the SLO; the nominal rate is shown beside it."""
    check = seed_plan.band.pessimistic
    assert check is not None and check.rate is not None
    assert seed_plan.recommended_rate == check.rate <= seed_plan.nominal_rate
    assert check.simulate_command.count("--gpu-param") == len(check.values) > 0
    args = shlex.split(check.simulate_command)[2:]
    stdout = " ".join(simulate_process(args, tmp_path / "pessimistic").split())
    assert f"held at every point, up to {check.rate:g} req/s" in stdout
    out = Console(width=100, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    out.print(render_group(seed_plan))
    text = " ".join(out.export_text().split())
    assert f"operate at or below {check.rate:g} req/s" in text
    assert f"{seed_plan.nominal_rate:g} req/s with the engine model's nominal figures" in text


def test_the_seed_plans_flags_never_refuse_the_workload(seed_plan):
    f = seed_plan.flags
    assert f.max_model_len >= 4096 and f.gpu_memory_utilization <= 0.90
    assert f.enable_prefix_caching
    assert "frees no KV memory" in f.reason("max_model_len")


def test_qwen_7b_on_eight_v100_holds_for_15_minutes_on_a_fresh_seed(tmp_path):
    """Fewer seeds than the default plan (one for verification) to keep the suite short."""
    quick = SearchSettings(verify_seeds=(201,))
    plan = make_plan(PlanRequest(model="Qwen-7B", variants=False, band=False, settings=quick))
    assert plan.sustainability is not None and plan.sustainability.ok
    ok, text = rerun(plan, 2, tmp_path)
    assert ok, text
