"""Re-prefill from a real vLLM's own counters: what `servefleet bench` derives (or bounds) from
the /metrics scraped before and after a point, beside the evidence that vLLM 0.26 counts no
recomputed token (its prompt_tokens equal the client's prompt tokens even under preemption).

    python benchmarks/real_gpu/reprefill_check.py BEFORE.txt AFTER.txt RECORDS.jsonl.gz [...]

(pairs of files, one triple per point). Prints one line per point.
"""

from __future__ import annotations

import sys
from pathlib import Path

from servefleet.bench.point import client_tokens
from servefleet.bench.scrape import COUNTERS, parse_metrics, server_delta
from servefleet.records import read_jsonl


def check(before: str, after: str, records: str) -> str:
    b = parse_metrics(Path(before).read_text())
    a = parse_metrics(Path(after).read_text())
    recs = list(read_jsonl(records))
    ct = client_tokens(recs)
    v = server_delta(b, a, [], ct)

    def d(key: str) -> float:
        name = COUNTERS[key]
        return a.get((name, ""), 0.0) - b.get((name, ""), 0.0)

    ratio = (
        f"{v.reprefill:.1%}"
        if v.reprefill is not None
        else f"n/a (at most {v.reprefill_max:.1%})"
        if v.reprefill_max is not None
        else "n/a"
    )
    return (
        f"{records}: {len(recs)} requests, preemptions {v.preemptions:,.0f}; "
        f"vllm:prompt_tokens {v.prompt_tokens:,.0f} vs the client's {ct.prompt_tokens:,} "
        f"(excess {v.prompt_tokens - ct.prompt_tokens:+,.0f}: recomputation is not counted); "
        f"prefix queries - prompt tokens {d('prefix_queries') - d('prompt_tokens'):+,.0f} "
        f"(blocked-head retries; re-admissions are not exported); longest context "
        f"{ct.max_context:,} tokens; re-prefill {ratio}"
    )


def main(argv: list[str]) -> int:
    if len(argv) % 3 or not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for i in range(0, len(argv), 3):
        print(check(*argv[i : i + 3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
