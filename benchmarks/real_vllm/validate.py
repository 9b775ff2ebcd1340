"""Simulated vs measured for every point of the real vLLM grid; writes docs/validation.md's table.

Usage: python benchmarks/real_vllm/validate.py [--write]   (prints; --write updates the doc's table)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.validation import METRICS, is_held_out, load_points, markdown_table, validate

ROOT = Path(__file__).resolve().parents[2]
POINTS = ROOT / "benchmarks" / "real_vllm" / "data" / "points.csv"
DOC = ROOT / "docs" / "validation.md"
BEGIN, END = "<!-- table:begin -->", "<!-- table:end -->"


def summary(rows) -> str:
    lines = [
        "| metric | median abs error, all | worst, all | median, held out | worst, held out |",
        "|---|---|---|---|---|",
    ]
    held = [r for r in rows if is_held_out(r.point)]
    for m in METRICS:
        a = [abs(r.error(m)) for r in rows]
        h = [abs(r.error(m)) for r in held]
        lines.append(
            f"| {m} | {statistics.median(a):.1%} | {max(a):.1%} | {statistics.median(h):.1%} | {max(h):.1%} |"
        )
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
    text = f"{summary(rows)}\n\n{markdown_table(rows)}"
    print(text)
    if args.write:
        doc = DOC.read_text()
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
