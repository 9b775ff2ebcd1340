"""Writes the synthetic trace samples next to this file (no downloads; the same files each run):

* ``mooncake-sample.jsonl``: Mooncake's format (``timestamp`` in ms, ``input_length``,
  ``output_length``, ``hash_ids`` of 512-token blocks). Requests start with one of a few shared
  documents (whole blocks), some continue an earlier request's prompt (its blocks again, as a
  conversation's next turn does without a session id), and every prompt ends in blocks of its
  own, the last one partial.
* ``azure-sample.csv``: Azure's LLM inference trace format (``TIMESTAMP,ContextTokens,
  GeneratedTokens``), bursty arrivals, timestamps with 7 decimals as published.
* ``records-sample.jsonl``: servefleet's own request records, as a bench run writes them.

    python tests/data/traces/make_samples.py
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np

from servefleet.records import RequestRecord, write_jsonl

HERE = Path(__file__).resolve().parent
BLOCK = 512


def mooncake(n: int = 120, seed: int = 35) -> list[dict]:
    rng = np.random.default_rng(seed)
    next_id = 0

    def new_blocks(k: int) -> list[int]:
        nonlocal next_id
        out = list(range(next_id, next_id + k))
        next_id += k
        return out

    docs = [new_blocks(int(rng.integers(2, 6))) for _ in range(5)]
    rows: list[dict] = []
    t = 0.0
    for _ in range(n):
        t += rng.exponential(500.0)  # ms: 2 req/s
        if rows and rng.random() < 0.3:  # continues an earlier prompt (its full blocks)
            prev = rows[int(rng.integers(len(rows)))]
            head = prev["hash_ids"][: prev["input_length"] // BLOCK]
        else:
            head = docs[int(rng.integers(len(docs)))]
        own = int(rng.integers(1, 4))  # own blocks, the last one partial
        length = (len(head) + own - 1) * BLOCK + int(rng.integers(1, BLOCK))
        rows.append(
            {
                "timestamp": round(t),
                "input_length": length,
                "output_length": int(rng.integers(16, 200)),
                "hash_ids": head + new_blocks(own),
            }
        )
    return rows


def azure(n: int = 100, seed: int = 35) -> list[tuple[str, int, int]]:
    rng = np.random.default_rng(seed)
    start = dt.datetime(2023, 11, 16, 18, 15, 46, 680590)
    rows, t = [], 0.0
    while len(rows) < n:
        t += rng.exponential(1.0)
        for _ in range(1 if rng.random() < 0.8 else int(rng.integers(2, 6))):  # bursts
            stamp = start + dt.timedelta(seconds=t + rng.uniform(0, 0.01))
            ctx, gen = int(rng.lognormal(6.5, 0.8)) + 1, int(rng.lognormal(5.0, 0.7))
            rows.append((stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", ctx, gen))
    rows.sort()
    return rows[:n]


def records(n: int = 40, seed: int = 35) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.exponential(0.25)
        prompt, output = int(rng.integers(100, 900)), int(rng.integers(10, 120))
        out.append(
            RequestRecord(
                request_id=f"r{i:06d}",
                class_name="trace",
                scheduled_time=round(t, 6),
                send_time=round(t + 0.0004, 6),
                first_token_time=round(t + 0.05, 6),
                end_time=round(t + 0.05 + 0.02 * output, 6),
                prompt_tokens=prompt,
                output_tokens=output,
                target_prompt_tokens=prompt,
                target_output_tokens=output,
                finish_reason="length",
            )
        )
    return out


def main() -> None:
    with (HERE / "mooncake-sample.jsonl").open("w") as f:
        for row in mooncake():
            f.write(json.dumps(row) + "\n")
    with (HERE / "azure-sample.csv").open("w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for stamp, ctx, gen in azure():
            f.write(f"{stamp},{ctx},{gen}\n")
    write_jsonl(records(), HERE / "records-sample.jsonl")


if __name__ == "__main__":
    main()
