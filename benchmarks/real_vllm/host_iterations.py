#!/usr/bin/env python3
"""vLLM's per-iteration log (``--enable-logging-iteration-details``, each line stamped with its
Unix time by ``VLLM_LOGGING_PREFIX='%(created).4f '``) → one CSV row per engine iteration, with
the grid series it fell in (``series.jsonl`` of ``run_host_grid.sh``).

    python3 host_iterations.py SERVER_LOG[.gz] SERIES_JSONL... --out iterations.csv.gz

Columns: t (Unix s, when the API server logged it), series, iter, ctx_reqs, ctx_tokens,
gen_reqs, gen_tokens, elapsed_ms (vLLM's "iteration elapsed time": how long the engine core
waited for the step's model output), kv_pct.
"""

import argparse
import bisect
import csv
import gzip
import json
import re
from pathlib import Path

LINE = re.compile(
    r"(?:^|\) )(\d{9,}\.\d+) .*Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, "
    r"(\d+) generation requests, (\d+) generation tokens, iteration elapsed time: "
    r"([\d.]+) ms, GPU KV cache usage: ([\d.]+)%"
)


def series_windows(paths: list[str]) -> list[tuple[float, float, str]]:
    start: dict[str, float] = {}
    out = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            e = json.loads(line)
            if "start" in e:
                start[e["series"]] = e["start"]
            elif "end" in e and e["series"] in start:
                out.append((start[e["series"]], e["end"], e["series"]))
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("series", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    wins = series_windows(a.series)
    starts = [w[0] for w in wins]
    opener = gzip.open if a.log.endswith(".gz") else open
    n = 0
    with opener(a.log, "rt", errors="replace") as f, gzip.open(a.out, "wt") as o:
        w = csv.writer(o)
        w.writerow(["t", "series", "iter", "ctx_reqs", "ctx_tokens", "gen_reqs", "gen_tokens",
                    "elapsed_ms", "kv_pct"])  # fmt: skip
        for line in f:
            m = LINE.search(line)  # after vLLM's '(APIServer pid=N) ' tag
            if not m:
                continue
            t = float(m.group(1))
            i = bisect.bisect_right(starts, t) - 1
            s = wins[i][2] if i >= 0 and t <= wins[i][1] else ""
            w.writerow([m.group(1), s, *m.groups()[1:]])
            n += 1
    print(f"{n} iterations -> {a.out}")


if __name__ == "__main__":
    main()
