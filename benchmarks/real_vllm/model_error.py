"""Write the twin's measured error per regime (src/servefleet/data/model_error.json) from the
validation tables of docs/validation.md.

    python benchmarks/real_vllm/model_error.py          # print the data
    python benchmarks/real_vllm/model_error.py --write  # and write the package's file

The planner reads the file (``servefleet.plan.model_error``); its schema is documented there
and in docs/plan.md. Each regime lists the points it rests on as ``docs/validation.md:LINE``
(the line of the row at the time of writing). Errors are ``simulated / measured - 1``:
negative latency errors and positive throughput errors are optimistic (the twin promises more
than vLLM delivered).

Axes (every validation run used one H200 replica, so each point has one concurrency per
replica):

* ``concurrency_per_replica`` (the base): the closed-loop points by concurrency band, TP 1,
  bf16, no bursts — absolute errors;
* ``tp`` (on top of the base): TP 2 / 4 / 8 from the published multi-GPU data, as the held-out
  bias relative to TP 1 (the table "Tensor parallelism");
* ``dtype`` (on top): fp8, the 1.5B fp8 points relative to the same points in bf16; fp16 has
  no point of its own (not measured);
* ``bursts`` (on top): enterprise-mix on the 14B shape.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "validation.md"
OUT = ROOT / "src" / "servefleet" / "data" / "model_error.json"

BANDS = [(1, 16), (17, 128), (129, None)]
"""Concurrency per replica: light, loaded, saturated (the API server falls behind past 128)."""


def _err(cell: str) -> float | None:
    m = re.search(r"\(([+\-−]?[\d.]+)%\)", cell)
    return None if m is None else float(m.group(1).replace("−", "-")) / 100


def _rows(lines: list[str]) -> list[dict]:
    """The per-point table: run, point, section, and each column's error, with its line."""
    out = []
    head: list[str] | None = None
    for n, line in enumerate(lines, 1):
        if line.startswith("| run | point | section |"):
            head = [c.strip().split(" ")[0] for c in line.strip("|\n").split("|")]
            continue
        if head is None or not line.startswith("| "):
            if head is not None and out:
                break
            continue
        cells = [c.strip() for c in line.strip("|\n").split("|")]
        if cells[0].startswith("---"):
            continue
        row = {"run": cells[0], "point": cells[1], "section": cells[2], "line": n}
        for name, cell in zip(head[3:], cells[3:], strict=False):
            row[name] = _err(cell)
        out.append(row)
    return out


def _bursts(lines: list[str]) -> list[dict]:
    out = []
    for n, line in enumerate(lines, 1):
        m = re.match(r"\| (\d+) req/s \|", line)
        if m and "enterprise" in "".join(lines[max(0, n - 6) : n]):
            cells = [c.strip() for c in line.strip("|\n").split("|")]
            out.append(
                {
                    "point": f"enterprise-mix {cells[0]}",
                    "line": n,
                    "output_throughput": _err(cells[1]),
                    "ttft": _err(cells[2]),
                    "tpot": _err(cells[3]),
                }
            )
    return out


def _tp(lines: list[str]) -> dict[int, tuple[float, int, int]]:
    """TP -> (held-out bias relative to TP 1 with the multi-GPU term, rows, line)."""
    out = {}
    for n, line in enumerate(lines, 1):
        m = re.match(
            r"\| ([248]) \| .*\| (\d+) \| .* \| [+\-−][\d.]+ % → ([+\-−][\d.]+) % \|$", line
        )
        if m:
            out[int(m.group(1))] = (float(m.group(3).replace("−", "-")) / 100, int(m.group(2)), n)
    return out


def _summary(values: list[float], optimistic_low: bool) -> dict:
    """median |error|, and the worst error each way (optimistic: the twin promising more)."""
    if not values:
        return {"median_abs": None, "optimistic": 0.0, "pessimistic": 0.0}
    lo, hi = min(values), max(values)
    return {
        "median_abs": round(statistics.median(abs(v) for v in values), 4),
        "optimistic": round(min(lo, 0.0) if optimistic_low else max(hi, 0.0), 4),
        "pessimistic": round(max(hi, 0.0) if optimistic_low else min(lo, 0.0), 4),
    }


def _keys(r: dict, figure: str) -> tuple[str, ...]:
    """The columns of a row that stand for ``figure``: mean and P99 (at concurrency 1 the
    mean only: a P99 of one stream is one request's outlier, the first after idle)."""
    single = r.get("point", "").endswith("_c1")
    if figure == "ttft":
        return ("mean_ttft_ms", "ttft") if single else ("mean_ttft_ms", "p99_ttft_ms", "ttft")
    return ("mean_tpot_ms", "tpot") if single else ("mean_tpot_ms", "p99_tpot_ms", "tpot")


def _regime(match: dict, rows: list[dict], validation: str, note: str = "") -> dict:
    ttft = [v for r in rows for k in _keys(r, "ttft") if (v := r.get(k)) is not None]
    itl = [v for r in rows for k in _keys(r, "itl") if (v := r.get(k)) is not None]
    thr = [v for r in rows if (v := r.get("output_throughput")) is not None]
    out = {
        "match": match,
        "validation": validation,
        "points": len(rows),
        "held_out": sum(1 for r in rows if r.get("section", "held out") != "fitted"),
        "ttft": _summary(ttft, True),
        "itl": _summary(itl, True),
        "throughput": _summary(thr, False),
        "sources": [
            f"docs/validation.md:{r['line']} {r.get('run', '')} {r['point']}".replace("  ", " ")
            for r in rows
        ],
    }
    if note:
        out["note"] = note
    return out


def _zero(match: dict, validation: str, note: str) -> dict:
    """An entry that adds nothing to the base regime's error."""
    none = {"median_abs": 0.0, "optimistic": 0.0, "pessimistic": 0.0}
    return {
        "match": match, "validation": validation, "points": 0, "held_out": 0,
        "ttft": none, "itl": none, "throughput": none, "sources": [], "note": note,
    }  # fmt: skip


def _relative(rows: list[dict], base: list[dict]) -> list[dict]:
    """``rows`` as errors relative to the same point of ``base`` ((1 + e) / (1 + e_base) - 1)."""
    by = {r["point"]: r for r in base if r["run"].startswith("h200-q1.5")}
    out = []
    for r in rows:
        b = by.get(r["point"])
        if b is None:
            continue
        rel = {k: v for k, v in r.items() if not isinstance(v, float)}
        for k, v in r.items():
            if isinstance(v, float) and isinstance(b.get(k), float):
                rel[k] = (1 + v) / (1 + b[k]) - 1
        out.append(rel)
    return out


def build() -> dict:
    lines = DOC.read_text().splitlines()
    rows = _rows(lines)
    bf16 = [r for r in rows if "fp8" not in r["run"]]
    fp8 = [r for r in rows if "fp8" in r["run"]]

    def conc(r: dict) -> int:
        m = re.search(r"_c(\d+)$", r["point"])
        return int(m.group(1)) if m else 1

    axes: dict[str, list[dict]] = {
        "concurrency_per_replica": [],
        "tp": [],
        "dtype": [],
        "bursts": [],
    }
    for lo, hi in BANDS:
        mine = [r for r in bf16 if conc(r) >= lo and (hi is None or conc(r) <= hi)]
        held = sum(1 for r in mine if r["section"] != "fitted")
        validation = "held out" if held >= 3 else "partly held out" if held else "fitted only"
        note = ""
        if hi is None:
            note = (
                "vLLM's API server falls behind its engine past about 128 streams: the twin's "
                "TPOT is far too low there (docs/validation.md, 'What remains unexplained')"
            )
        axes["concurrency_per_replica"].append(
            _regime({"min": lo, "max": hi}, mine, validation, note)
        )
    axes["tp"].append(_zero({"tp": 1}, "the base", "the closed loops ran at TP 1"))
    for tp, (bias, n, line) in sorted(_tp(lines).items()):
        row = {"point": f"TP {tp}, {n} held-out rows relative to TP 1", "line": line, "tpot": bias}
        r = _regime(
            {"tp": tp},
            [row],
            "published data",
            (
                "vLLM 0.5 / 0.2 and SGLang on H100 / A100: the bias relative to TP 1 of held-out "
                "rows; no multi-GPU run measured here; TTFT taken as TPOT's"
            ),
        )
        r["ttft"] = r["itl"]
        r["points"] = r["held_out"] = n
        axes["tp"].append(r)
    axes["dtype"].append(_zero({"dtype": "bf16"}, "the base", "the closed loops ran in bf16"))
    axes["dtype"].append(
        _regime(
            {"dtype": "fp8"},
            _relative(fp8, bf16),
            "held out",
            (
                "the 1.5B shape's fp8 points relative to the same points in bf16; fp8 GEMM fractions "
                "assumed"
            ),
        )
    )
    axes["dtype"].append(
        _zero(
            {"dtype": "fp16"},
            "none",
            (
                "no fp16 run: the same kernel shapes as bf16; on a GPU without bf16 the uncertainty band "
                "carries the GPU's own figures"
            ),
        )
    )
    axes["bursts"].append(_zero({"bursts": False}, "the base", "the closed loops had no bursts"))
    axes["bursts"].append(
        _regime(
            {"bursts": True},
            _bursts(lines),
            "held out",
            (
                "enterprise-mix on the Qwen1.5-14B shape at 3 and 6 req/s (120-request bursts): TTFT "
                "P95 and TPOT mean, on top of the base"
            ),
        )
    )
    return {
        "schema": 1,
        "about": (
            "The twin's error against real vLLM 0.26 per regime: simulated / measured - 1 of each "
            "figure, from the validation tables of docs/validation.md (benchmarks/real_vllm/"
            "model_error.py writes this file). The axis concurrency_per_replica is the base "
            "(closed loops, TP 1, bf16, no bursts: absolute errors); the other axes add their "
            "error on top of it (relative to the base; 0 for the base's own value). Per axis, "
            "the entry whose match fits the plan's regime; per figure, median_abs (median "
            "|error|), optimistic (the worst error that promises more than vLLM gave: negative "
            "for ttft and itl, positive for throughput; 0 when none) and pessimistic (the worst "
            "the other way). itl is the step time (TPOT mean and P99): the ITL P95 under load. "
            "validation: held out, partly held out, fitted only, published data, the base, none."
        ),
        "axes": axes,
    }


def main() -> None:
    data = build()
    text = json.dumps(data, indent=1) + "\n"
    if "--write" in sys.argv:
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}")
    else:
        print(text)


if __name__ == "__main__":
    main()
