"""The capacity planner: memory arithmetic, flags and their reasons, the search, the predicted
point against `servefleet simulate`, impossible requests, fleet.yaml, vllm serve lines, CLI."""

from __future__ import annotations

import io
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from servefleet.client_protocol import ClientProtocol
from servefleet.engine.memory import plan_memory
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.plan.cost import cost_estimate, gpus_needed
from servefleet.plan.flags import (
    LEN_ROUND,
    Overrides,
    choose_flags,
    choose_global,
    choose_max_model_len,
    choose_prefix_caching,
    full_chunk_step,
)
from servefleet.plan.fleet_yaml import Fleet, dump_fleet, parse_fleet
from servefleet.plan.longest import declared_longest
from servefleet.plan.memory_table import memory_row
from servefleet.plan.plan_json import plan_dict
from servefleet.plan.planner import PlanImpossible, PlanRequest, deployment_for, make_plan
from servefleet.plan.plausibility import Physics, check_claims, check_slo
from servefleet.plan.precision import choose_precision, quality_check, quantization_options
from servefleet.plan.profile import load_any_workload, profile_workload
from servefleet.plan.render import build_fleet, serve_script
from servefleet.plan.search import SearchSettings, SLOTarget
from servefleet.records import read_jsonl
from servefleet.sim.runner import Load, simulate_point

V100 = "V100-SXM2-32G"
CLI_ENV = {
    "COLUMNS": "200",
    "PATH": "/usr/bin:/bin",
    **{k: os.environ[k] for k in ("PYTHONPATH", "SERVEFLEET_PURE_PYTHON") if k in os.environ},
}
FAST = SearchSettings(
    window=20.0,
    warmup=5.0,
    long_window=40.0,
    long_e2e_multiple=1.0,
    long_warmup=10.0,
    verify_window=40.0,
    verify_seeds=(201,),
)
"""Short windows everywhere: the sustainability stage runs, on minutes instead of hours."""


def small_request(**kw) -> PlanRequest:
    """Qwen-7B on 2 x V100, chat-3tier, short points: a whole plan in about a second."""
    base = dict(model="Qwen-7B", num_gpus=2, workload="chat-3tier", jobs=1, settings=FAST)
    return PlanRequest(**(base | kw))


@pytest.fixture(scope="module")
def small_plan():
    return make_plan(small_request())


@pytest.fixture(scope="module")
def chat_profile():
    return profile_workload(load_any_workload("chat-3tier"))


@pytest.fixture(scope="module")
def chat_longest(chat_profile):
    return declared_longest(load_any_workload("chat-3tier"), chat_profile)


def write_trace(path: Path, totals: list[int], *, prefix: int = 0) -> Path:
    lines = []
    for i, t in enumerate(totals):
        rec = {"timestamp": i * 0.5, "prompt_tokens": t - 50, "output_tokens": 50}
        if prefix:
            rec |= {"prefix_group": "sys", "prefix_tokens": prefix}
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- precision --------------------------------------------------------------------------------


def test_v100_runs_fp16_and_says_why():
    p = choose_precision(load_model("Qwen1.5-14B"), get_gpu(V100))
    assert (p.dtype, p.stored, p.vllm_dtype) == ("fp16", "bf16", "half")
    assert "no bf16" in p.reason and "compute capability 7.0" in p.reason
    assert "casts" in p.reason
    a100 = choose_precision(load_model("Qwen1.5-14B"), get_gpu("A100-80G-SXM"))
    assert a100.dtype == "bf16" and "stored in bf16" in a100.reason


def test_quantization_table_knows_what_v100_can_run():
    opts = {
        q.name: q for q in quantization_options(load_model("Qwen1.5-14B"), get_gpu(V100), 2, "fp16")
    }
    base = opts["fp16 (chosen)"]
    assert base.weights_per_gpu == -(-load_model("Qwen1.5-14B").weight_bytes("fp16") // 2)
    assert math.isclose(base.decode_bound_s, base.weights_per_gpu / 900e9)
    assert opts["GPTQ 4-bit"].supported and not opts["AWQ 4-bit"].supported
    assert not opts["fp8 (W8A8)"].supported and not opts["int8 (W8A8)"].supported
    assert opts["GPTQ 4-bit"].weights_per_gpu < 0.35 * base.weights_per_gpu


def test_a_lower_precision_comes_with_the_quality_command():
    """A plan that offers fp8/int8/4-bit weights or an fp8 KV cache names the `servefleet
    quality` line that measures what it changes; one with nothing lower says nothing."""
    h200 = quantization_options(load_model("Qwen2.5-7B"), get_gpu("H200"), 1, "bf16")
    offered, command = quality_check("bf16", "auto", h200)
    assert "fp8 (W8A8)" in offered and command.startswith("servefleet quality ")
    assert quality_check("fp8", "auto", [])[0] == "fp8 weights"
    assert quality_check("bf16", "fp8", [])[0] == "an fp8 KV cache"
    assert quality_check("bf16", "auto", [q for q in h200 if not q.supported]) is None


# ---- memory -------------------------------------------------------------------------------------


def test_fp8_kv_cache_halves_the_bytes_per_token_in_the_memory_arithmetic(
    chat_profile, chat_longest
):
    """`plan --kv-cache-dtype fp8`: the flags, the memory rows and the deployment all hold
    twice the tokens in the same KV memory (the user's choice; never the planner's)."""
    model, gpu = load_model("Qwen2.5-7B"), get_gpu("H200")
    glob = choose_global(model, chat_profile, chat_longest, Overrides())
    rows = {}
    for kv in ("auto", "fp8"):
        ov = Overrides(kv_cache_dtype=kv)
        flags = choose_flags(model, gpu, "bf16", 1, chat_profile, glob, ov, 0.1)
        assert flags.kv_cache_dtype == kv and flags.values()["kv_cache_dtype"] == kv
        rows[kv] = memory_row(model, gpu, "bf16", 1, 1, flags, glob.max_model_len, 1568.0)
        dep = deployment_for(model, gpu, "bf16", 1, 1, flags)
        assert dep.kv_dtype == ("fp8" if kv == "fp8" else "bf16")
    auto, fp8 = rows["auto"].memory, rows["fp8"].memory
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    assert fp8.kv_tokens > 1.9 * auto.kv_tokens


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_memory_rows_are_plan_memory(chat_profile, chat_longest, tp):
    model, gpu = load_model("Qwen1.5-14B"), get_gpu(V100)
    glob = choose_global(model, chat_profile, chat_longest, Overrides())
    flags = choose_flags(model, gpu, "fp16", tp, chat_profile, glob, Overrides(), 0.1)
    row = memory_row(model, gpu, "fp16", tp, 8 // tp, flags, glob.max_model_len, 1568.0)
    want = plan_memory(
        model,
        gpu,
        tp,
        "fp16",
        flags.gpu_memory_utilization,
        flags.max_num_batched_tokens,
        flags.max_num_seqs,
        flags.block_size,
    )
    assert row.memory == want
    assert row.longest_context == want.num_gpu_blocks * want.block_size
    assert math.isclose(row.concurrency, want.kv_tokens / 1568.0)
    assert row.feasible == (want.fits and want.kv_tokens >= glob.max_model_len)


def test_70b_on_eight_v100_excludes_small_tp_because_it_does_not_fit(chat_profile, chat_longest):
    model, gpu = load_model("Llama-2-70B"), get_gpu(V100)
    glob = choose_global(model, chat_profile, chat_longest, Overrides())
    rows = {}
    for tp in (1, 2, 4, 8):
        flags = choose_flags(model, gpu, "fp16", tp, chat_profile, glob, Overrides(), 0.1)
        rows[tp] = memory_row(model, gpu, "fp16", tp, 8 // tp, flags, glob.max_model_len, 1568.0)
    for tp in (1, 2):
        assert not rows[tp].feasible and "does not fit" in rows[tp].problem
        assert rows[tp].memory.weights > rows[tp].memory.budget
    assert rows[8].feasible and rows[8].memory.kv_tokens >= glob.max_model_len
    # fp16 weights alone: 138 GB / 4 = 34.5 GB > 0.90 x 31.75 GiB, so TP=4 cannot run either
    assert not rows[4].feasible


def test_a_model_that_fits_nowhere_is_a_clear_impossibility():
    with pytest.raises(PlanImpossible) as e:
        make_plan(small_request(model="Llama-2-70B", num_gpus=2))
    msg = str(e.value)
    assert "does not fit on 2 x V100-SXM2-32G" in msg
    assert "TP=1: does not fit" in msg and "TP=2: does not fit" in msg
    assert "GPTQ 4-bit" in msg  # a way out, with its memory


# ---- flags --------------------------------------------------------------------------------------


def test_max_model_len_covers_the_longest_declared_request(tmp_path, chat_profile, chat_longest):
    model = load_model("Qwen1.5-14B")  # 32,768 positions
    # chat-3tier: 2,000 + 200 at most -> + 10 % -> 3,072, but never below 4,096
    assert chat_longest.tokens == 2_200 and chat_longest.declared
    value, why, problem = choose_max_model_len(model, chat_profile, chat_longest)
    assert value == 4_096 and problem is None
    assert "frees no KV memory" in why and "2,200" in why
    # enterprise-mix: a 5-turn session resends its history: 5 x (600 + 1,000) = 8,000
    spec = load_any_workload("enterprise-mix")
    prof = profile_workload(spec)
    longest = declared_longest(spec, prof)
    assert longest.tokens == 8_000 and "5 turns" in longest.how
    assert prof.total_percentile(100) < longest.tokens  # a sample would have set it too low
    value, why, problem = choose_max_model_len(model, prof, longest)
    assert value == math.ceil(8_000 * 1.1 / LEN_ROUND) * LEN_ROUND == 9_216 and problem is None
    # a trace: its longest record
    trace = load_any_workload(str(write_trace(tmp_path / "t.jsonl", list(range(100, 10_001, 100)))))
    tprof = profile_workload(trace)
    tl = declared_longest(trace, tprof)
    assert tl.tokens == 10_000
    assert choose_max_model_len(model, tprof, tl)[0] == 11_264


def test_a_max_model_len_that_refuses_declared_requests_is_an_error_with_the_fix(chat_profile):
    spec = load_any_workload("enterprise-mix")
    prof = profile_workload(spec)
    longest = declared_longest(spec, prof)
    _, _, problem = choose_max_model_len(load_model("Qwen1.5-14B"), prof, longest, fixed=3_072)
    assert "--max-model-len 3,072 would refuse part of the declared workload" in problem
    assert "--max-model-len 9,216" in problem and "HTTP 400" in problem
    with pytest.raises(PlanImpossible, match="would refuse part of the declared workload"):
        make_plan(small_request(overrides=Overrides(max_model_len=2_048)))


def test_gpu_memory_utilization_follows_the_gpu_family(chat_profile, chat_longest):
    glob = choose_global(load_model("Qwen-7B"), chat_profile, chat_longest, Overrides())
    for gpu, want in ((V100, 0.90), ("H200-SXM", 0.92), ("A100-80G-SXM", 0.92)):
        f = choose_flags(
            load_model("Qwen-7B"), get_gpu(gpu), "fp16", 1, chat_profile, glob, Overrides(), 0.1
        )
        assert f.gpu_memory_utilization == want, gpu
    assert "out-of-memory errors above 0.90" in choose_flags(
        load_model("Qwen-7B"), get_gpu(V100), "fp16", 1, chat_profile, glob, Overrides(), 0.1
    ).reason("gpu_memory_utilization")


def test_prefix_caching_is_on_with_the_hit_rate_the_workload_allows(tmp_path, chat_profile):
    on, why = choose_prefix_caching(chat_profile, 16)
    assert on and "0.0%" in why and "no hit is expected" in why
    spec = load_any_workload(str(write_trace(tmp_path / "p.jsonl", [1050] * 50, prefix=640)))
    prof = profile_workload(spec)
    # 49 of 50 prompts of 1,000 tokens start with the same 640: 640 / 1000 of their tokens
    assert math.isclose(prof.shared_fraction(16), 49 * 640 / (50 * 1000))
    on, why = choose_prefix_caching(prof, 16)
    assert on and "62.7%" in why and "expected hit rate" in why
    off, why = choose_prefix_caching(prof, 16, fixed=False)
    assert not off and why.startswith("set by you")


def test_chunk_budget_keeps_a_full_chunk_step_within_the_itl_slo(chat_profile, chat_longest):
    model, gpu = load_model("Qwen1.5-14B"), get_gpu(V100)
    glob = choose_global(model, chat_profile, chat_longest, Overrides())
    flags = choose_flags(model, gpu, "fp16", 2, chat_profile, glob, Overrides(), 0.1)
    dep = deployment_for(model, gpu, "fp16", 2, 4, flags)
    cost = dep.cost_model()
    chunk = flags.max_num_batched_tokens
    why = flags.reason("max_num_batched_tokens")
    decodes = int(why.split(" decodes")[0].rsplit(" ", 1)[1])
    ctx = int(chat_profile.mean_prompt + chat_profile.mean_output / 2)
    assert full_chunk_step(cost, chunk, decodes, ctx) <= 0.1
    assert full_chunk_step(cost, 2 * chunk, decodes, ctx) > 0.1
    assert f"{chunk:,}-token" in why
    assert flags.max_num_seqs <= chunk and flags.reason("max_num_seqs").startswith("the KV cache")


def test_user_flags_are_kept(chat_profile, chat_longest):
    model, gpu = load_model("Qwen-7B"), get_gpu(V100)
    ov = Overrides(max_model_len=2304, max_num_seqs=48, max_num_batched_tokens=1024)
    glob = choose_global(model, chat_profile, chat_longest, ov)
    assert glob.problem is None  # 2,304 >= the longest request, 2,200
    f = choose_flags(model, gpu, "fp16", 1, chat_profile, glob, ov, 0.1)
    assert (f.max_model_len, f.max_num_seqs, f.max_num_batched_tokens) == (2304, 48, 1024)
    assert all(f.reason(k).startswith("set by you") for k in ("max_model_len", "max_num_seqs"))


# ---- the plan and the simulator -----------------------------------------------------------------


def test_predicted_point_equals_simulate_point(small_plan):
    p, dep = small_plan.point, small_plan.deployment
    again = simulate_point(
        dep,
        small_plan.workload,
        Load(rate=p.rate),
        duration=p.duration,
        warmup=p.warmup,
        seed=p.seed,
        policy=small_plan.chosen.candidate.policy,
        slo=small_plan.request.slo.stats_slo(),
    )
    assert again.summary.to_dict() == p.summary.to_dict()
    assert again.peak_kv_usage == p.peak_kv_usage
    assert p.ok and p.ttft <= 2.0 and p.itl <= 0.1


def simulate_process(args: list[str], out: Path, timeout: float = 120) -> str:
    """`servefleet simulate ARGS --out OUT` as a process; its stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", "servefleet.cli", "simulate", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=CLI_ENV,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_predicted_point_equals_servefleet_simulate_process(small_plan, tmp_path):
    args = small_plan.simulate_command.split()[2:]  # drop "servefleet simulate"
    out = tmp_path / "sim"
    stdout = simulate_process(args, out)
    got = json.loads((out / "summary.json").read_text())["points"][0]["summary"]
    want = json.loads(json.dumps(small_plan.point.summary.to_dict()))
    assert got == want
    assert f"{small_plan.point.rate:g} req/s" in stdout


def test_the_client_protocol_is_planned_for_recorded_and_reproduced(tmp_path):
    """A plan for clients that stream completions with usage on every chunk: every candidate
    simulates that protocol, plan.json says so, and the reproduce line carries it."""
    client = ClientProtocol("completions", usage_per_chunk=True)
    plan = make_plan(small_request(model="Qwen2.5-1.5B", gpu="H200-SXM", num_gpus=1, client=client))
    assert plan.deployment.client == client
    d = plan_dict(plan)
    assert d["request"]["client"] == {"endpoint": "completions", "continuous_usage": True}
    assert "--endpoint completions --client-protocol usage-per-chunk" in plan.simulate_command
    out = tmp_path / "sim"
    simulate_process(plan.simulate_command.split()[2:], out)
    meta = json.loads((out / "summary.json").read_text())
    assert meta["client"] == d["request"]["client"]
    assert meta["points"][0]["summary"] == json.loads(json.dumps(plan.point.summary.to_dict()))


def test_named_classes_are_judged_each_on_its_own_and_the_reproduce_line_agrees(tmp_path):
    """--slo-classes: each named class meets its own SLO (here a tighter one for one class);
    the reproduce line carries the classes and `servefleet simulate` prints the same verdict."""
    slo = SLOTarget(
        classes=frozenset({"balanced", "decode-heavy"}), limits=(("decode-heavy", 1.0, 0.1),)
    )
    plan = make_plan(small_request(slo=slo, variants=False, band=False))
    p = plan.point
    assert p.ok and p.per_class["decode-heavy"]["ttft"] <= 1.0
    assert p.per_class["balanced"]["ttft"] <= 2.0
    assert "--slo-classes balanced,decode-heavy:ttft=1" in plan.simulate_command
    args = shlex.split(plan.simulate_command)[2:]
    stdout = " ".join(simulate_process(args, tmp_path / "sim").split())
    assert "SLOs of classes balanced, decode-heavy, each on its own" in stdout
    assert "held at every point" in stdout.split("SLOs of classes")[1].split("class ")[0]


def test_a_class_judged_alone_is_not_hidden_by_the_pool():
    """Records where the pooled P95 is fast but one small class is slow: judged on its own,
    that class decides (and names itself)."""
    from servefleet.plan.search import _scoped, judge
    from servefleet.records import RequestRecord
    from servefleet.stats import Window, summarize

    def rec(i, cls, ttft):
        t0 = float(i)
        return RequestRecord(
            f"{cls}{i}", cls, t0, t0, first_token_time=t0 + ttft, end_time=t0 + ttft + 0.2,
            chunk_times=[t0 + ttft, t0 + ttft + 0.05, t0 + ttft + 0.1], chunk_tokens=[1, 1, 1],
            prompt_tokens=100, output_tokens=3, status="ok",
        )  # fmt: skip

    records = [rec(i, "qa", 0.2) for i in range(60)] + [rec(i, "sessions", 6.0) for i in range(3)]
    summary = summarize(records, Window(0, 100))
    pooled = SLOTarget()
    ttft, itl, _, cls = _scoped(summary, records, pooled)
    assert judge(ttft, itl, pooled, summary, cls)[0]  # 3 of 63 slow: P95 is a fast one
    named = SLOTarget(classes=frozenset({"qa", "sessions"}))
    ttft, itl, miss, cls = _scoped(summary, records, named)
    ok, why = judge(ttft, itl, named, summary, cls)
    assert not ok and cls == "sessions" and ttft == pytest.approx(6.0) and miss == 1.0
    assert why.startswith("class sessions") and "TTFT P95 6.00 s > 2 s" in why


def test_search_covers_every_split_and_brackets_the_rate(small_plan):
    assert [r.candidate.deployment.tp for r in small_plan.topologies] == [1, 2]
    chosen = small_plan.chosen
    rates = sorted(p.rate for p in chosen.points)
    ok = [p.rate for p in chosen.points if p.ok]
    bad = [p.rate for p in chosen.points if not p.ok and p.rate > max(ok)]
    assert chosen.max_rate == max(ok)
    assert bad and min(bad) / max(ok) <= 1 + FAST.rel_tol + 1e-9
    assert len(set(rates)) == len(rates)  # no rate simulated twice
    assert small_plan.variants and small_plan.variants[0].candidate.variant == "vLLM defaults"
    assert small_plan.frontier and all(f.slo_ok for f in small_plan.frontier)


def test_two_workers_give_the_same_plan_every_time():
    a, b = make_plan(small_request(jobs=2)), make_plan(small_request(jobs=2))
    assert a.jobs == b.jobs == 2
    assert [(r.candidate.label, [p.rate for p in r.points]) for r in a.topologies + a.variants] == [
        (r.candidate.label, [p.rate for p in r.points]) for r in b.topologies + b.variants
    ]
    assert a.point.summary.to_dict() == b.point.summary.to_dict()


def test_plan_json_has_every_step(small_plan):
    d = json.loads(json.dumps(plan_dict(small_plan)))
    for key in ("precision", "memory", "flags", "physical_bounds", "topologies", "chosen", "fleet"):
        assert d[key]
    assert d["chosen"]["predicted"]["summary"]["ttft"]["p95"] == small_plan.point.summary.ttft.p95
    assert set(d["flags"]["reasons"]) >= {"max_model_len", "max_num_seqs", "enable_prefix_caching"}
    assert d["timing"]["points_simulated"] == small_plan.points_simulated
    assert d["quality_check"]["command"].startswith("servefleet quality")  # V100: GPTQ 4-bit


@pytest.mark.parametrize("width", [80, 60])
def test_plan_renders_in_a_narrow_terminal_without_cutting_a_figure(small_plan, width):
    from rich.console import Console

    from servefleet.plan.report import render_group

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(render_group(small_plan))
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    assert f"{small_plan.point.rate:g}" in text and "(continued)" in text
    flat = " ".join(text.split())
    assert "model error: this answer's regime:" in flat and "Validated no better than" in flat
    data = plan_dict(small_plan)["model_error"]
    assert data["ttft_factor"] >= 1 and data["regime"]["tp"] == small_plan.deployment.tp


def test_target_rate_and_prices():
    plan = make_plan(small_request(target_rate=4.0, gpu_price=2.0, variants=False))
    cap = plan.capacity
    per_replica = plan.point.rate / plan.deployment.replicas
    assert cap.replicas == math.ceil(4.0 / per_replica)
    assert cap.gpus == cap.replicas * plan.deployment.tp and cap.verified is not None
    s = plan.point.summary
    assert math.isclose(plan.cost.per_month, plan.deployment.num_gpus * 2.0 * 730)
    assert math.isclose(
        plan.cost.per_million_output_tokens,
        plan.deployment.num_gpus * 2.0 / 3600 / s.output_throughput * 1e6,
    )


def test_cost_and_gpus_needed_arithmetic():
    c = cost_estimate(8, 2.5, 1000.0, 4000.0)
    assert c.per_month == 8 * 2.5 * 730 and math.isclose(c.per_million_output_tokens, 20 / 3.6)
    g = gpus_needed(20.0, 5.0, 4, 2, 8)
    assert (g.replicas, g.gpus, g.fits_inventory) == (16, 32, False)


# ---- impossible requests and plausibility ----------------------------------------------------


def test_slo_below_the_decode_bound_is_impossible_with_the_arithmetic():
    with pytest.raises(PlanImpossible) as e:
        make_plan(small_request(slo=SLOTarget(ttft=2.0, itl=0.002)))
    msg = str(e.value)
    assert "decode bound" in msg and "GB/s" in msg and "--slo-itl must be at least" in msg


def test_an_slo_the_simulated_fleet_never_meets_says_what_it_would_meet():
    with pytest.raises(PlanImpossible) as e:
        make_plan(small_request(slo=SLOTarget(ttft=0.2, itl=0.1)))
    msg = str(e.value)
    assert "the physical bounds allow it, the simulated engine does not" in msg
    assert "2 x TP=1: at" in msg and "1 x TP=2: at" in msg
    assert "--slo-ttft 0." in msg


def test_bursts_bound_the_ttft_percentile():
    model, gpu = load_model("Qwen1.5-14B"), get_gpu(V100)
    prof = profile_workload(load_any_workload("enterprise-mix"))
    assert prof.burst.size == 120 and prof.burst.classes == ("summaries",)
    findings = check_slo(Physics(model, gpu, "fp16"), prof, 8, 8, 2.0, 0.1, 95.0)
    burst = next(f for f in findings if f.check == "burst")
    assert not burst.ok and burst.bound > 2.0 and "PFLOP" in burst.text
    json.dumps([f.to_dict() for f in findings] + [prof.to_dict()])  # plain JSON, no numpy
    scoped = check_slo(
        Physics(model, gpu, "fp16"), prof, 8, 8, 2.0, 0.1, 95.0, frozenset({"qa", "sessions"})
    )
    assert all(f.check != "burst" for f in scoped)


def test_claims_below_the_bounds_are_flagged(chat_profile):
    phys = Physics(load_model("Qwen1.5-14B"), get_gpu(V100), "fp16")
    found = {
        f.check: f
        for f in check_claims(
            phys, chat_profile, {"itl": 0.001, "throughput": 1e6, "ttft": 10.0}, 8, 8
        )
    }
    assert not found["claim-itl"].ok and "900 GB/s" in found["claim-itl"].text
    assert not found["claim-throughput"].ok
    assert found["claim-ttft"].ok


# ---- what to run --------------------------------------------------------------------------------


def test_serve_lines_pin_gpus_and_carry_the_flags(small_plan):
    dep = deployment_for(
        load_model("Qwen-7B"),
        get_gpu(V100),
        "fp16",
        2,
        4,
        small_plan.chosen.candidate.flags,
    )
    fleet = build_fleet(dep, "Qwen-7B", small_plan.precision, 8, 1, "least-outstanding", 32)
    lines = [fleet.serve_command(r) for r in fleet.replicas]
    assert len(lines) == 4
    for i, line in enumerate(lines):
        assert line.startswith(f"CUDA_VISIBLE_DEVICES={2 * i},{2 * i + 1} vllm serve Qwen/Qwen-7B ")
        for flag in (
            "--tensor-parallel-size 2",
            "--dtype half",
            f"--max-model-len {dep.max_model_len}",
            f"--max-num-seqs {dep.max_num_seqs}",
            f"--max-num-batched-tokens {dep.max_num_batched_tokens}",
            f"--gpu-memory-utilization {dep.gpu_memory_utilization:g}",
            "--block-size 16",
            "--trust-remote-code",
            f"--port {8001 + i}",
        ):
            assert flag in line
        assert ("--no-enable-prefix-caching" in line) != dep.enable_prefix_caching
    script = serve_script(fleet, "test")
    assert script.startswith("#!/usr/bin/env bash") and script.count("vllm serve") == 4


def test_fleet_yaml_round_trips(small_plan):
    text = dump_fleet(small_plan.fleet)
    again = parse_fleet(text)
    assert again == small_plan.fleet
    assert isinstance(again, Fleet) and again.engine == "vllm"
    assert again.replicas[0].gpu_ids == list(range(small_plan.deployment.tp))


def test_fleet_yaml_rejects_inconsistent_fleets(small_plan):
    base = small_plan.fleet.model_dump(mode="json")
    bad_tp = json.loads(json.dumps(base))
    bad_tp["replicas"][0]["gpu_ids"] = [0]
    bad_tp["replicas"][0]["tp"] = 2
    with pytest.raises(ValueError, match="tp=2 needs 2 gpu_ids"):
        Fleet.model_validate(bad_tp)
    twice = json.loads(json.dumps(base))
    twice["replicas"].append(twice["replicas"][0] | {"name": "other", "port": 9000})
    with pytest.raises(ValueError, match=r"shared by 2 replicas .* at most 0\.50"):
        Fleet.model_validate(twice)
    with pytest.raises(ValueError, match="name a GPU twice"):
        Fleet.model_validate(bad_tp | {"replicas": [bad_tp["replicas"][0] | {"gpu_ids": [0, 0]}]})
    with pytest.raises(ValueError, match="engine"):
        parse_fleet("model: {name: a, path: b}\nengine: docker\n")


def test_fleet_yaml_lets_replicas_share_a_gpu_when_their_memory_fits(small_plan):
    base = small_plan.fleet.model_dump(mode="json")
    one = base["replicas"][0] | {"tp": 1, "gpu_ids": [0]}
    shared = base | {
        "vllm": base["vllm"] | {"gpu_memory_utilization": 0.45},
        "replicas": [one | {"name": "a", "port": 9001}, one | {"name": "b", "port": 9002}],
    }
    fleet = Fleet.model_validate(shared)
    assert fleet.replicas_per_gpu() == 2
    assert [r.name for r in fleet.gpu_sharers(fleet.replicas[0])] == ["b"]
    lopsided = shared | {
        "replicas": [*shared["replicas"], one | {"name": "c", "port": 9003, "gpu_ids": [1]}]
    }
    lop = Fleet.model_validate(lopsided)
    assert lop.gpu_sharers(lop.replicas[2]) == []
    with pytest.raises(ValueError, match="sharing factor"):
        lop.replicas_per_gpu()
    if small_plan.fleet.gpus.count >= 2:
        mixed = base | {
            "vllm": base["vllm"] | {"gpu_memory_utilization": 0.45},
            "replicas": [
                base["replicas"][0] | {"name": "a", "port": 9001, "tp": 2, "gpu_ids": [0, 1]},
                one | {"name": "b", "port": 9002},
            ],
        }
        with pytest.raises(ValueError, match="same set of GPUs"):
            Fleet.model_validate(mixed)


# ---- the command line -------------------------------------------------------------------------


def _app() -> typer.Typer:
    from servefleet.plan.cli import register

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)

    @app.command()
    def other() -> None:  # a second command, so that `plan` stays a subcommand
        pass

    return app


FAST_ARGS = [
    "--model",
    "Qwen-7B",
    "--num-gpus",
    "2",
    "--window",
    "20",
    "--warmup",
    "5",
    "--jobs",
    "1",
    "--no-band",
]
"""A quick plan: short screening windows, no band (the long runs still take ~10 s here)."""


def test_register_adds_plan_with_json_and_out(tmp_path):
    args = ["plan", *FAST_ARGS, "--no-sustain", "--json", "--out", str(tmp_path)]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["kind"] == "plan" and data["chosen"]["rate"] > 0
    assert {p.name for p in tmp_path.iterdir()} == {
        "plan.json",
        "plan.md",
        "fleet.yaml",
        "serve.sh",
    }
    assert parse_fleet((tmp_path / "fleet.yaml").read_text()).replicas
    md = (tmp_path / "plan.md").read_text()
    assert md.startswith("# servefleet plan:") and "(continued)" not in md  # tables whole
    assert "CUDA_VISIBLE_DEVICES=0,1" in (tmp_path / "serve.sh").read_text()


def test_kv_cache_dtype_reaches_the_serve_line_fleet_yaml_and_reproduce_line(tmp_path):
    args = ["plan", *FAST_ARGS, "--no-sustain", "--kv-cache-dtype", "fp8", "--json"]
    res = CliRunner().invoke(_app(), [*args, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    fleet = parse_fleet((tmp_path / "fleet.yaml").read_text())
    assert fleet.vllm.kv_cache_dtype == "fp8"
    assert "--kv-cache-dtype fp8" in (tmp_path / "serve.sh").read_text()
    assert "--kv-cache-dtype fp8" in json.dumps(json.loads(res.stdout))  # the simulate line


def test_cli_process_explains_and_times(tmp_path):
    code = (
        "import sys, typer; from servefleet.plan.cli import register; "
        "app = typer.Typer(add_completion=False); register(app); "
        "app.command('noop')(lambda: None); app(sys.argv[1:])"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "plan",
            *FAST_ARGS,
            "--gpu-price",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=CLI_ENV,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in (
        "has no bf16",
        "Memory per GPU",
        "--max-model-len",
        "Physical bounds",
        "reproduce (prints the same row): servefleet simulate",
        "CUDA_VISIBLE_DEVICES=",
        "per million output tokens",
        "planned in",
        "verification at",
        "recommendation: operate at or below",
    ):
        assert text in out, text
    assert (tmp_path / "serve.sh").stat().st_mode & 0o111


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slo-itl", "0.001"], "decode bound"),
        (["--model", "Llama-2-70B"], "does not fit"),
        (["--gpu", "V99"], "unknown"),
        (["--workload", "nope.yaml"], "no such workload"),
        (["--slo-classes", "chat"], "not classes of chat-3tier"),
        (["--claim", "speed=3"], "unknown claim"),
        (["--kv-cache-dtype", "int4"], "unknown --kv-cache-dtype"),
    ],
)
def test_cli_bad_requests_exit_2_without_traceback(args, message):
    res = CliRunner().invoke(_app(), ["plan", *FAST_ARGS, *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_profile_is_seeded_and_percentiles_are_observed(chat_profile):
    again = profile_workload(load_any_workload("chat-3tier"))
    assert np.array_equal(again.totals, chat_profile.totals)
    assert set(np.unique(chat_profile.totals)) == {900, 1600, 2200}
    assert chat_profile.total_percentile(50) in (900, 1600, 2200)


def test_a_repo_id_is_served_as_named_with_its_presets_shape(tmp_path):
    res = CliRunner().invoke(
        _app(),
        [
            "plan",
            *FAST_ARGS,
            "--model",
            "Qwen/Qwen1.5-14B-Chat",
            "--no-sustain",
            "--no-variants",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    fleet = parse_fleet((tmp_path / "fleet.yaml").read_text())
    assert fleet.model.path == "Qwen/Qwen1.5-14B-Chat" and fleet.model.name == "Qwen1.5-14B"
    serve = (tmp_path / "serve.sh").read_text()
    assert "vllm serve Qwen/Qwen1.5-14B-Chat " in serve
    # clients ask for the model by the name the user gave (the preset's name is an alias)
    assert "--served-model-name Qwen/Qwen1.5-14B-Chat Qwen1.5-14B " in serve
    assert "served as Qwen/Qwen1.5-14B-Chat" in res.output
    assert "the preset Qwen1.5-14B's shape" in " ".join(res.output.split())


def test_a_long_prompt_pool_is_the_last_replicas_in_the_fleet_and_the_simulator(tmp_path):
    """`--long-replicas N` (and `pool: long` in fleet.yaml): the last N replicas take every
    prompt over the length-pools threshold (1,500 tokens), the others none."""
    out = tmp_path / "sim"
    args = [
        *("--model", "Qwen-7B", "--num-gpus", "2", "--tp", "1", "--replicas", "2"),
        *("--workload", "chat-3tier", "--rate", "2", "--duration", "30", "--warmup", "5"),
        *("--policy", "length-pools", "--long-replicas", "1"),
    ]
    simulate_process(args, out)
    records = [r for f in out.glob("records-*.jsonl.gz") for r in read_jsonl(f)]
    assert {r.replica for r in records if r.prompt_tokens > 1500} == {"replica-1"}
    assert {r.replica for r in records if r.prompt_tokens <= 1500} == {"replica-0"}
    plan = make_plan(small_request(variants=False, settings=SearchSettings(sustain=False)))
    dep = plan.deployment.with_(replicas=4)
    fleet = build_fleet(dep, "Qwen-7B", plan.precision, 8, 1, "length-pools", 32, long_replicas=2)
    assert [r.pool for r in fleet.replicas] == ["default", "default", "long", "long"]


def test_a_production_trace_is_planned_with_its_options(tmp_path):
    """`plan --workload trace:FILE --max-requests N`: the plan profiles those N records, and the
    workload.yaml it writes for its `simulate` line keeps the options."""
    from servefleet.plan.cli import write_plan
    from servefleet.workload import load_workload

    trace = Path(__file__).parent / "data" / "traces" / "azure-sample.csv"
    req = small_request(
        workload=f"trace:{trace}",
        workload_overrides={"trace": {"max_requests": 60}},
        variants=False,
        band=False,
    )
    plan = make_plan(req)
    assert plan.profile.num_requests == 60 and plan.profile.trace_records == 60
    assert "--workload workload.yaml" in plan.simulate_command
    write_plan(plan, plan_dict(plan), tmp_path)
    assert load_workload(tmp_path / "workload.yaml").trace.max_requests == 60
