#!/usr/bin/env python3
"""Round the times in a bench folder's ``records-*.jsonl.gz`` to 0.1 ms, in place (same schema,
about a third of the size), so that a grid's every per-request record fits what a run may carry
back and what the repository keeps.

    python3 compact_records.py BENCH_OUT_DIR
"""

import gzip
import json
import sys
from pathlib import Path

TIMES = ("scheduled_time", "send_time", "first_token_time", "end_time", "queue_time")


def compact(path: Path) -> int:
    rows = []
    with gzip.open(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            for k in TIMES:
                if isinstance(r.get(k), float):
                    r[k] = round(r[k], 4)
            r["chunk_times"] = [round(t, 4) for t in r.get("chunk_times") or ()]
            rows.append(r)
    with gzip.open(path, "wt", compresslevel=9) as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return len(rows)


if __name__ == "__main__":
    for p in sorted(Path(sys.argv[1]).glob("records-*.jsonl.gz")):
        print(p.name, compact(p), "records rounded to 0.1 ms")
