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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="update the table in docs/validation.md")
    args = ap.parse_args()
    dep = resolve_deployment(
        load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), tp=1, max_model_len=8192
    )
    rows = validate(dep, load_points(POINTS))
    text = f"{summary(rows)}\n\n{markdown_table(rows)}"
    print(text)
    if args.write:
        doc = DOC.read_text()
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
