"""Does the planned rate hold in production? The planner's acceptance check, for three cases.

For each case the plan is made (as `servefleet plan` makes it), then its own "reproduce" line —
`servefleet simulate ... --rate R` — is run as a process with `--duration 900 --warmup 60` on
seeds 1, 2 and 3 (none of them a seed the plan used: it screens on 0, searches on 101 and
verifies on 201-203). A seed passes when the plan's SLO holds over the 15-minute window and
the requests finished inside the window are >= 97 % of those sent inside it, with no failed
request.

    python benchmarks/plan_sustainability.py [--cases seed,qwen7b,h200] [--seeds 1,2,3]

Cases: `seed` Qwen1.5-14B on 8 x V100-SXM2-32G; `qwen7b` Qwen-7B on 8 x V100-SXM2-32G;
`h200` Qwen2.5-7B on 2 x H200-SXM; all chat-3tier, TTFT P95 <= 2 s, ITL P95 <= 100 ms.
It prints each plan's wall time and the machine's load average (the h200 plan takes minutes:
it simulates ~40 req/s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servefleet.plan.planner import PlanRequest, make_plan

CASES = {
    "seed": PlanRequest(model="Qwen1.5-14B", gpu="V100-SXM2-32G", num_gpus=8),
    "qwen7b": PlanRequest(model="Qwen-7B", gpu="V100-SXM2-32G", num_gpus=8),
    "h200": PlanRequest(model="Qwen2.5-7B", gpu="H200-SXM", num_gpus=2),
}
MIN_FINISHED = 0.97


def rerun_args(command: str, seed: int, duration: float = 900, warmup: float = 60) -> list[str]:
    """The plan's `servefleet simulate` line with another window and seed, as argv."""
    for flag, value in (("--duration", duration), ("--warmup", warmup), ("--seed", seed)):
        command = re.sub(rf"{flag} \S+", f"{flag} {value:g}", command)
    return shlex.split(command)[2:]  # drop "servefleet simulate"


def check(summary: dict, slo_ttft: float, slo_itl: float) -> tuple[bool, str]:
    """(holds, in words) for one `summary.json` point: SLO and finished share."""
    s = summary
    window = s["window"]["end"] - s["window"]["start"]
    sent = s["window_requests"]  # sent inside the window (num_requests: the whole point)
    finished = s["request_throughput"] * window / sent if sent else 0.0
    ttft, itl = s["ttft"]["p95"], s["itl"]["p95"]
    failed = s["num_failed"]
    ok = ttft <= slo_ttft and itl <= slo_itl and finished >= MIN_FINISHED and failed == 0
    return ok, (
        f"TTFT P95 {ttft:.2f} s, ITL P95 {itl * 1e3:.0f} ms, finished {finished:.1%} of "
        f"{sent:,} sent, {failed} failed"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seeds", default="1,2,3")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    all_ok = True
    for name in args.cases.split(","):
        req = CASES[name]
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        plan = make_plan(req)
        wall = time.perf_counter() - t0
        print(
            f"{name}: {req.model} on {req.num_gpus} x {req.gpu}: planned "
            f"{plan.chosen.candidate.label} at {plan.point.rate:g} req/s in {wall:.1f} s "
            f"(load average {load0:.2f} -> {os.getloadavg()[0]:.2f})"
        )
        print(f"  reproduce: {plan.simulate_command}")
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp:
                argv = [*rerun_args(plan.simulate_command, seed), "--out", tmp]
                proc = subprocess.run(
                    [sys.executable, "-m", "servefleet.cli", "simulate", *argv],
                    capture_output=True,
                    text=True,
                    env=os.environ | {"COLUMNS": "200"},
                )
                if proc.returncode != 0:
                    print(f"  seed {seed}: simulate failed: {proc.stderr.strip()[-400:]}")
                    all_ok = False
                    continue
                point = json.loads((Path(tmp) / "summary.json").read_text())["points"][0]
            ok, text = check(point["summary"], req.slo.ttft, req.slo.itl)
            all_ok &= ok
            print(f"  seed {seed}, 900 s after 60 s of warm-up: {'✓' if ok else '✗'} {text}")
    print("all hold" if all_ok else "SOME DO NOT HOLD")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
