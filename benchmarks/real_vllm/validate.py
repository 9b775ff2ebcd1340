"""Simulated vs measured for every point of the real vLLM runs, by section; writes
docs/validation.md's tables.

Usage: python benchmarks/real_vllm/validate.py [--write]   (prints; --write updates the doc)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.plan.fleet_yaml import load_fleet
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.validation import (
    METRICS,
    MIX_METRICS,
    SECTIONS,
    compare_bench,
    load_points,
    markdown_table,
    section,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]
POINTS = ROOT / "benchmarks" / "real_vllm" / "data" / "points.csv"
DOC = ROOT / "docs" / "validation.md"
BEGIN, END = "<!-- table:begin -->", "<!-- table:end -->"


def summary(rows) -> str:
    """Median and worst absolute error of each metric, per section."""
    lines = [
        "| section | points | " + " | ".join(f"{m} median / worst" for m in METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for name in SECTIONS:
        part = [r for r in rows if section(r.point) == name]
        if not part:
            lines.append(f"| {name} | 0 | " + " | ".join("—" for _ in METRICS) + " |")
            continue
        cells = []
        for m in METRICS:
            errs = [abs(r.error(m)) for r in part]
            cells.append(f"{statistics.median(errs):.1%} / {max(errs):.1%}")
        lines.append(f"| {name} | {len(part)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


MIX_RUN = POINTS.parent / "h200-q14-mix"


def mix_table() -> str:
    """The enterprise-mix runs (overload and bursts): simulate of the fleet against the bench."""
    fleet = load_fleet(MIX_RUN / "fleet.yaml")
    dep = resolve_deployment(
        load_model(fleet.model.name), get_gpu(fleet.gpus.type), **fleet.deployment_settings()
    )
    lines = [
        "| enterprise-mix, Qwen1.5-14B shape | "
        + " | ".join(f"{m} sim / real (err)" for m in MIX_METRICS)
        + " |",
        "|---|" + "---|" * len(MIX_METRICS),
    ]
    for rate in (3, 6):
        bench = json.loads((MIX_RUN / "bench" / f"rate{rate}" / "summary.json").read_text())
        for c in compare_bench(dep, fleet.gateway.policy.name, bench):
            cells = [
                f"{c.simulated[m]:.4g} / {c.measured[m]:.4g} ({c.error(m):+.1%})"
                for m in MIX_METRICS
            ]
            lines.append(f"| {c.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


DATA = POINTS.parent
RUNS = {
    # run -> (model, dtype, kv-cache dtype): the server each run measured (its README / flags.txt)
    "run1_grid": ("Qwen2.5-7B", "auto", "auto"),
    "run2_overload": ("Qwen2.5-7B", "auto", "auto"),
    "h200-q1.5-bf16": (str(DATA / "h200-q1.5-bf16" / "config.json"), "auto", "auto"),
    "h200-q1.5-fp8": (str(DATA / "h200-q1.5-fp8" / "config.json"), "fp8", "fp8"),
}


def deployment(run: str):
    model, dtype, kv = RUNS[run]
    return resolve_deployment(
        load_model(model),
        get_gpu("H200-SXM"),
        tp=1,
        max_model_len=8192,
        dtype=dtype,
        kv_cache_dtype=kv,
    )


def validate_all(points):
    rows = []
    for run in dict.fromkeys(p.run for p in points):
        rows += validate(deployment(run), [p for p in points if p.run == run])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="update the table in docs/validation.md")
    args = ap.parse_args()
    rows = validate_all(load_points(POINTS))
    text = f"{summary(rows)}\n\n{mix_table()}\n\n{markdown_table(rows)}"
    print(text)
    if args.write:
        doc = DOC.read_text()
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
