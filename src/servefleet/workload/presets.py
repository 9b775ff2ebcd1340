"""Named workloads. Each is a plain dict in the YAML schema, so a YAML file can start from one
(``base: enterprise-mix``) and override any field. See docs/workload.md for the numbers and why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .errors import WorkloadError

CHAT_3TIER_RATE = 10.0
SHAREGPT_RATE = 10.0

# enterprise-mix: the shares (of requests, every session turn counted) and the Q&A rate fix the
# total rate; the burst size and the turns per session then fix the other two processes.
QA_RATE = 35.0
SHARES = {"qa": 0.62, "summaries": 0.23, "sessions": 0.15}
TOTAL_RATE = QA_RATE / SHARES["qa"]  # 56.45 req/s
SUMMARY_BURST = 120
SUMMARY_PERIOD = round(SUMMARY_BURST / (SHARES["summaries"] * TOTAL_RATE), 4)  # 9.2422 s
SESSION_TURNS = 5
SESSION_RATE = round(SHARES["sessions"] * TOTAL_RATE / SESSION_TURNS, 5)  # 1.69355 sessions/s
THINK_TIME_MEAN = 8.2


def chat_3tier(arg: str | None = None) -> dict:
    tiers = {"balanced": (1300, 300), "decode-heavy": (400, 500), "prefill-heavy": (2000, 200)}
    return {
        "name": "chat-3tier",
        "description": "equal mix of three fixed (prompt, output) shapes, Poisson arrivals",
        "arrival": {"type": "poisson", "rate": CHAT_3TIER_RATE},
        "classes": {n: {"weight": 1.0, "prompt": p, "output": o} for n, (p, o) in tiers.items()},
    }


def enterprise_mix(arg: str | None = None) -> dict:
    def normal(mean, sd, lo, hi):
        return {"type": "normal", "mean": mean, "sd": sd, "min": lo, "max": hi}

    return {
        "name": "enterprise-mix",
        "description": "62% Q&A, 23% document summaries in bursts, 15% multi-turn sessions (by requests)",
        "classes": {
            "qa": {
                "weight": 62.0,
                "prompt": 287,
                "output": 156,
                "arrival": {"type": "poisson", "rate": QA_RATE},
            },
            "summaries": {
                "weight": 23.0,
                "prompt": normal(1842, 632, 64, 4096),
                "output": normal(412, 89, 16, 1024),
                "arrival": {"type": "bursts", "count": SUMMARY_BURST, "period": SUMMARY_PERIOD},
            },
            "sessions": {
                "weight": 15.0,
                "prompt": normal(200, 60, 16, 600),
                "output": normal(440, 120, 32, 1000),
                "session": {"turns": SESSION_TURNS, "think_time_mean": THINK_TIME_MEAN},
                "arrival": {"type": "poisson", "rate": SESSION_RATE},
            },
        },
    }


def sharegpt(arg: str | None = None) -> dict:
    dataset = {"type": "sharegpt"} | ({"path": arg} if arg else {})
    return {
        "name": "sharegpt",
        "description": "prompt/output length pairs from a ShareGPT file, Poisson arrivals",
        "arrival": {"type": "poisson", "rate": SHAREGPT_RATE},
        "classes": {"sharegpt": {"dataset": dataset}},
    }


def trace(arg: str | None = None) -> dict:
    stem = Path(Path(arg).name.removesuffix(".gz")).stem if arg else ""
    return {
        "name": "".join(c if c.isalnum() or c in "_.+-" else "-" for c in stem) or "trace",
        "description": "a replayed trace: each record one request at its recorded time",
        "trace": {"path": arg} if arg else {},
    }


PRESETS: dict[str, Callable[[str | None], dict]] = {
    "chat-3tier": chat_3tier,
    "enterprise-mix": enterprise_mix,
    "sharegpt": sharegpt,
    "trace": trace,
}
USAGE = {
    "sharegpt": "sharegpt:PATH (a ShareGPT JSON file)",
    "trace": "trace:PATH (Mooncake JSONL, Azure CSV, servefleet records or trace JSONL)",
}


def is_preset(name: str) -> bool:
    return name.split(":", 1)[0] in PRESETS


def preset(name: str) -> dict:
    """The preset ``name`` or ``name:ARG`` as a dict in the YAML schema."""
    key, _, arg = name.partition(":")
    if key not in PRESETS:
        raise WorkloadError(f"unknown preset {key!r}; presets are: {', '.join(PRESETS)}")
    return PRESETS[key](arg or None)
