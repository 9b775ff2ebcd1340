"""The cost model's TPOT against public multi-GPU serving measurements, per tensor-parallel size.

Reads ``data.csv`` (one published measurement a row, with its source) and predicts each with the
engine's cost model, as the simulator does, twice: with the multi-GPU step's fitted parts (the
barrier wait and the executor, ``servefleet.hardware_tp.TPCosts``) set to 0, which leaves the
derived ones (all-reduces by algorithm, the logits' all-gather, the sampler over the whole
vocabulary), and with the constants the cost model uses. Prints the all-reduce model against
``allreduce.csv``, then the median bias (predicted / measured - 1) per TP, for all rows, the
fitted ones and the held-out ones (``--rows``: every row), and the same for the held-out rows of
each engine generation (``generation``), so that what the bias at TP = 1 rests on shows.

``data.csv`` columns: ``id``; ``series`` (rows of one source, model, GPU and workload that differ
only in TP); ``source_url``; ``engine`` and ``engine_version``; ``gpu`` and ``model`` (this
project's catalog names for the hardware and the shape); ``dtype``; ``tp``; ``workload`` (below);
``batch``; ``input_lens`` / ``output_lens`` (tokens, ``;``-separated, one per request where the
source lists them); ``metric`` and ``value`` (the published number and its unit); ``what`` (how
the source measured it); ``split`` (``fit``, ``holdout`` or ``excluded``); ``note`` (why a row is
excluded); ``engine_version`` begins with the version number (``0.5.4``, ``0.11.0``), and says
``V0`` where a vLLM from 0.8 on ran its older engine. ``allreduce.csv``: ``source_url``, ``gpu``, ``implementation``, ``algorithm``
(``oneshot`` / ``twoshot`` / ``nccl``, or ``auto`` for vLLM's choice by size), ``tp``,
``bytes``, ``time_us`` (per all-reduce), ``what``.

How each workload is predicted (the step times are ``CostModel.step_time``):

* ``burst`` (``vllm benchmark_serving`` with every request sent at once): one prefill step of
  all prompts from idle, then decode steps of the requests still running until each has its
  output; a request's TPOT is (its last token - its first) / (output - 1), and the row's value
  the median (or mean) over requests with more than one output token (the benchmark's
  definition);
* ``fixed_batch`` (``benchmark_latency``): the prompts prefilled in steps of at most
  ``PREFILL_BUDGET`` tokens, then ``output - 1`` decode steps of the whole batch; the value is
  the batch's end-to-end latency;
* ``decode_step`` (a model runner timed alone, e.g. ``sglang.bench_latency``): the GPU's time of
  one decode step of the batch at context ``input + output / 2``, without the engine's host work.

Run: ``python benchmarks/tp_public/compare.py`` (``--fit`` refits the two constants).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from servefleet.engine.cost_model import CostModel
from servefleet.hardware import get_gpu
from servefleet.hardware_tp import TPCosts, algorithm_time, allreduce_time
from servefleet.models import ModelSpec, load_model

DATA = Path(__file__).with_name("data.csv")
KERNELS = Path(__file__).with_name("allreduce.csv")
PREFILL_BUDGET = 4096
"""vLLM before chunked prefill scheduled at most max(max_model_len, 2048) prompt tokens a step;
4096 for the 4k-context models of the ``fixed_batch`` rows."""

LLAMA_33B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 6656,
    "intermediate_size": 17920,
    "num_attention_heads": 52,
    "num_hidden_layers": 60,
    "num_key_value_heads": 52,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "torch_dtype": "float16",
}
"""huggyllama/llama-30b's config.json (LLaMA 33B): no preset ships it."""


def model_spec(name: str) -> ModelSpec:
    if name == "LLaMA-33B":
        return ModelSpec.from_hf_config(LLAMA_33B, name=name)
    return load_model(name)


WITHOUT = TPCosts(sync_s=0.0, executor_step_s=0.0, executor_per_seq_s=0.0)
"""The term's fitted parts off: the all-reduces and the logits' all-gather only."""


def step_time(
    cm: CostModel,
    tokens: int,
    seqs: int,
    context: int,
    chunks: list[tuple[int, int]],
    sampled: int,
    from_idle: bool | None,
) -> float:
    """``CostModel.step_time``; ``from_idle=None`` asks for the GPU's time alone (a model runner
    timed without its engine)."""
    decodes = 0 if chunks else seqs
    if from_idle is None:
        return cm.breakdown(tokens, seqs, decodes, context, chunks, sampled).gpu
    return cm.step_time(tokens, seqs, decodes, context, chunks, sampled, from_idle)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(";")]


def predict(row: dict[str, str], costs: TPCosts) -> float:
    """The row's metric as the cost model (with the multi-GPU constants ``costs``) predicts it,
    in the row's unit."""
    gpu = get_gpu(row["gpu"])
    cm = CostModel(model_spec(row["model"]), gpu, int(row["tp"]), row["dtype"], tp_costs=costs)
    step = step_time
    work = row["workload"]
    ins, outs = _ints(row["input_lens"]), _ints(row["output_lens"])
    if work == "decode_step":
        b = int(row["batch"])
        return 1e3 * step(cm, b, b, b * (ins[0] + outs[0] // 2), [], b, None)
    if work == "fixed_batch":
        b, p, o = int(row["batch"]), ins[0], outs[0]
        per_step = max(1, PREFILL_BUDGET // p)
        t, done = 0.0, 0
        while done < b:
            n = min(per_step, b - done)
            t += step(cm, n * p, n, 0, [(p, 0)] * n, n, done == 0)
            done += n
        for k in range(1, o):
            t += step(cm, b, b, b * (p + k), [], b, False)
        return t
    if work == "burst":
        reqs = [(i, o) for i, o in zip(ins, outs, strict=True) if o > 0]
        t = step(
            cm, sum(i for i, _ in reqs), len(reqs), 0, [(i, 0) for i, _ in reqs], len(reqs), True
        )
        first = t
        done = dict.fromkeys(range(len(reqs)), 1)
        finish: dict[int, float] = {}
        for k, (_, o) in enumerate(reqs):
            if o == 1:
                finish[k] = t
        while len(finish) < len(reqs):
            running = [k for k in range(len(reqs)) if k not in finish]
            context = sum(reqs[k][0] + done[k] for k in running)
            t += step(cm, len(running), len(running), context, [], len(running), False)
            for k in running:
                done[k] += 1
                if done[k] == reqs[k][1]:
                    finish[k] = t
        tpots = [(finish[k] - first) / (o - 1) for k, (_, o) in enumerate(reqs) if o > 1]
        if row["metric"] == "median_tpot_ms":
            return 1e3 * statistics.median(tpots)
        return 1e3 * statistics.fmean(tpots)
    raise ValueError(f"unknown workload {work!r}")


def biases(rows: list[dict[str, str]], costs: TPCosts) -> dict[str, tuple[float, float | None]]:
    """Row id -> (bias, bias relative to the same series at TP = 1, None without a TP = 1 row).

    The relative bias, (predicted / measured) / (predicted / measured at TP = 1) - 1, takes out
    what a series gets wrong at every TP (an older engine's host work, another GPU's kernels) and
    leaves what changes with TP: the multi-GPU step."""
    ratio = {r["id"]: predict(r, costs) / float(r["value"]) for r in rows}
    base = {r["series"]: ratio[r["id"]] for r in rows if r["tp"] == "1"}
    out: dict[str, tuple[float, float | None]] = {}
    for r in rows:
        b = base.get(r["series"])
        out[r["id"]] = (ratio[r["id"]] - 1, None if b is None else ratio[r["id"]] / b - 1)
    return out


def fit(rows: list[dict[str, str]]) -> TPCosts:
    """``sync_s`` from the ``fit`` rows that time the GPU alone (``decode_step``: no executor),
    then ``executor_step_s`` from the other ``fit`` rows with that ``sync_s``; each minimises the
    squared log of the relative bias (grids: 0-30 us by 0.5 us, 0-1 ms by 25 us)."""

    def err(subset: list[dict[str, str]], costs: TPCosts) -> float:
        rel = [v[1] for v in biases(subset, costs).values() if v[1] is not None]
        return sum(math.log1p(x) ** 2 for x in rel)

    fit_rows = [r for r in rows if r["split"] == "fit"]
    kernel = [r for r in fit_rows if r["workload"] == "decode_step"]
    served = [r for r in fit_rows if r["workload"] != "decode_step"]
    sync_s = min((k * 0.5e-6 for k in range(61)), key=lambda v: err(kernel, TPCosts(sync_s=v)))
    executor_s = min(
        (k * 25e-6 for k in range(41)),
        key=lambda v: err(served, TPCosts(sync_s=sync_s, executor_step_s=v)),
    )
    return TPCosts(sync_s=sync_s, executor_step_s=executor_s)


def kernel_check() -> None:
    """The all-reduce model against the cited kernel timings (``allreduce.csv``): rows that name
    an algorithm against that algorithm's time, ``auto`` rows against the one vLLM would pick."""
    print("| kernel data | algorithm | points | median error | worst |")
    print("|---|---|---|---|---|")
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in csv.DictReader(KERNELS.open()):
        link = get_gpu(r["gpu"]).interconnect
        nbytes, tp = float(r["bytes"]), int(r["tp"])
        algo = r["algorithm"]
        if algo == "auto":
            model = allreduce_time(nbytes, tp, link)
        else:
            model = algorithm_time(algo, nbytes, tp, link)
        source = r["source_url"].split("github.com/")[1].replace("/pull/", " #")
        groups[f"{r['implementation']} ({source})", algo].append(
            model * 1e6 / float(r["time_us"]) - 1
        )
    for (name, algo), errs in groups.items():
        worst = max(errs, key=abs)
        print(f"| {name} | {algo} | {len(errs)} | {statistics.median(errs):+.0%} | {worst:+.0%} |")


def generation(row: dict[str, str]) -> str:
    """The row's engine generation: vLLM before 0.6 (the V0 engine before its multi-step and async
    output processing), vLLM 0.6-0.7 (V0 with async output processing), vLLM from 0.8 (the V1
    engine, unless the row says ``V0``), SGLang before 0.4 and from 0.4 (its overlap scheduler)."""
    version = tuple(int(x) for x in row["engine_version"].split()[0].split(".")[:2])
    if row["engine"] == "sglang":
        return "SGLang < 0.4" if version < (0, 4) else "SGLang >= 0.4"
    if version < (0, 6):
        return "vLLM < 0.6"
    if version < (0, 8) or "V0" in row["engine_version"]:
        return "vLLM >= 0.6, V0"
    return "vLLM >= 0.8, V1"


GENERATIONS = ("vLLM < 0.6", "vLLM >= 0.6, V0", "vLLM >= 0.8, V1", "SGLang < 0.4", "SGLang >= 0.4")


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):+.1%}" if values else "—"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", action="store_true", help="print every row's biases")
    ap.add_argument(
        "--fit",
        action="store_true",
        help="refit sync_s and executor_step_s to the fit rows instead of the defaults",
    )
    args = ap.parse_args(argv)
    kernel_check()
    rows = [r for r in csv.DictReader(DATA.open()) if r["split"] != "excluded"]
    costs = fit(rows) if args.fit else TPCosts()
    if args.fit:
        print(f"fitted: sync_s={costs.sync_s:.1e} executor_step_s={costs.executor_step_s:.2e}")
    before = biases(rows, WITHOUT)
    after = biases(rows, costs)
    if args.rows:
        for r in rows:
            (b, rb), (a, ra) = before[r["id"]], after[r["id"]]
            rel = "" if rb is None or ra is None else f"   relative {rb:+7.1%} -> {ra:+7.1%}"
            print(f"{r['id']:32s} tp={r['tp']} {r['split']:8s} {b:+7.1%} -> {a:+7.1%}{rel}")
    header = (
        "| TP | n | median bias without the fitted parts | with them "
        "| relative to TP 1, without | with |"
    )
    tps = sorted({int(r["tp"]) for r in rows})

    def table(name: str, subsets: list[tuple[str, list[dict[str, str]]]]) -> None:
        print(f"| {name} {header}")
        print("|---" * 7 + "|")
        for label, subset in subsets:
            for tp in tps:
                ids = [r["id"] for r in subset if int(r["tp"]) == tp]
                if not ids:
                    continue
                rel_b = [before[i][1] for i in ids if before[i][1] is not None]
                rel_a = [after[i][1] for i in ids if after[i][1] is not None]
                print(
                    f"| {label} | {tp} | {len(ids)} | {_median([before[i][0] for i in ids])} "
                    f"| {_median([after[i][0] for i in ids])} | {_median(rel_b)} "
                    f"| {_median(rel_a)} |"
                )

    table(
        "rows",
        [(s, [r for r in rows if s in ("all", r["split"])]) for s in ("all", "fit", "holdout")],
    )
    held = [r for r in rows if r["split"] == "holdout"]
    table(
        "held out, engine",
        [(g, [r for r in held if generation(r) == g]) for g in GENERATIONS],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
