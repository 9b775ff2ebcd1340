"""The twin's measured error, carried into the plan: which regime an answer is in, how well
that regime is validated, and how far the real figures may sit from the simulated ones.

Data: ``servefleet/data/model_error.json`` (written by ``benchmarks/real_vllm/model_error.py``
from docs/validation.md; schema 1). ``axes.concurrency_per_replica`` is the base — closed loops
at TP 1, bf16, no bursts — with absolute errors; ``axes.tp``, ``axes.dtype`` and
``axes.bursts`` add their own on top (0 for the base's value). Each entry has a ``match``
(``min``/``max`` for the concurrency, else one value), ``validation`` (held out, partly held
out, fitted only, published data, the base, none), ``points``, and per figure (``ttft``,
``itl``, ``throughput``) ``median_abs``, ``optimistic`` and ``pessimistic`` errors
(simulated / measured − 1), with ``sources``.

Rule: for each axis, the entry matching the plan's regime (the most requests in flight on one
replica at the verified rate, the TP, the dtype, bursts or not); a latency the twin predicts may
really be up to ``1 / (1 + optimistic)`` times larger on each axis, the factors multiplied; a
rate it sustains may really be ``1 / (1 + optimistic throughput)`` times smaller. An axis with
no matching entry counts as not validated, with no error added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

AXES = ("concurrency_per_replica", "tp", "dtype", "bursts")


@cache
def load() -> dict:
    """The packaged model-error data."""
    text = resources.files("servefleet").joinpath("data", "model_error.json").read_text()
    data = json.loads(text)
    if data.get("schema") != 1:
        raise ValueError(f"model_error.json: schema {data.get('schema')!r}, expected 1")
    return data


def _matches(entry: dict, value) -> bool:
    m = entry["match"]
    if "min" in m:
        return value >= m["min"] and (m["max"] is None or value <= m["max"])
    return next(iter(m.values())) == value


def describe_axis(axis: str, entry: dict | None, value) -> str:
    name = {
        "concurrency_per_replica": f"{value} requests in flight per replica",
        "tp": f"TP={value}",
        "dtype": str(value),
        "bursts": "bursts" if value else "no bursts",
    }[axis]
    if entry is None or entry["validation"] == "none":
        return f"{name}: not measured"
    v = entry["validation"]
    if v == "the base":
        return f"{name}: as measured"
    if axis == "concurrency_per_replica":
        m = entry["match"]
        band = f"{m['min']}-{m['max']}" if m["max"] is not None else f"over {m['min'] - 1}"
        name += f" (band {band})"
    return f"{name}: {entry['points']} point(s), {v}"


@dataclass(frozen=True, slots=True)
class RegimeError:
    regime: dict
    """The plan's regime: concurrency_per_replica, tp, dtype, bursts."""
    entries: dict[str, dict | None]
    """Axis -> the matching entry of the data (None: no entry matches)."""

    def _factor(self, figure: str) -> float:
        f = 1.0
        for e in self.entries.values():
            if e is None:
                continue
            opt = e[figure]["optimistic"]
            if figure == "throughput":
                f /= 1 + max(opt, 0.0)
            else:
                f /= 1 + min(opt, 0.0)
        return f

    @property
    def ttft_factor(self) -> float:
        """A simulated TTFT may really be up to this many times larger."""
        return self._factor("ttft")

    @property
    def itl_factor(self) -> float:
        """A simulated ITL (the step time) may really be up to this many times larger."""
        return self._factor("itl")

    @property
    def rate_factor(self) -> float:
        """A simulated sustainable rate may really be this fraction of itself (<= 1)."""
        return self._factor("throughput")

    @property
    def validated(self) -> str:
        """How well the regime is validated: its weakest axis's level."""
        return self.weakest[1]

    @property
    def weakest(self) -> tuple[str, str]:
        """(axis, level) of the least validated axis (``the base`` counts as held out)."""
        order = ["held out", "partly held out", "published data", "fitted only", "none"]
        worst, level = "concurrency_per_replica", "held out"
        for axis in AXES:
            e = self.entries.get(axis)
            v = "none" if e is None else e["validation"]
            v = "held out" if v == "the base" else v if v in order else "none"
            if order.index(v) > order.index(level):
                worst, level = axis, v
        return worst, level

    def describe(self) -> str:
        """The regime and how well each axis of it is validated, in words."""
        return "; ".join(describe_axis(a, self.entries.get(a), self.regime[a]) for a in AXES)

    def notes(self) -> list[str]:
        return [
            e["note"]
            for e in self.entries.values()
            if e and e.get("note") and e["validation"] != "the base"
        ]

    def to_dict(self) -> dict:
        return {
            "regime": self.regime,
            "validated": self.validated,
            "ttft_factor": self.ttft_factor,
            "itl_factor": self.itl_factor,
            "rate_factor": self.rate_factor,
            "entries": {
                a: None
                if e is None
                else {
                    "match": e["match"],
                    "validation": e["validation"],
                    "points": e["points"],
                    "ttft": e["ttft"],
                    "itl": e["itl"],
                    "throughput": e["throughput"],
                    "sources": e["sources"],
                }
                for a, e in self.entries.items()
            },
        }


def regime_error(concurrency: int, tp: int, dtype: str, bursts: bool) -> RegimeError:
    """The twin's error in the regime of ``concurrency`` requests in flight per replica, ``tp``,
    ``dtype`` (fp16, bf16, fp8 ...) and ``bursts``."""
    data = load()["axes"]
    regime = {
        "concurrency_per_replica": max(1, int(concurrency)),
        "tp": tp,
        "dtype": dtype,
        "bursts": bool(bursts),
    }
    entries = {
        axis: next((e for e in data.get(axis, []) if _matches(e, regime[axis])), None)
        for axis in AXES
    }
    return RegimeError(regime, entries)


def used_share(p, limits_of, err: RegimeError | None = None) -> float:
    """The larger share of its limit that a point's TTFT and ITL use (× the twin's error when
    ``err`` is given); infinite when nothing was measured."""
    lt, li = limits_of(p.slo_class)
    if p.ttft is None:
        return float("inf")
    ft, fi = (1.0, 1.0) if err is None else (err.ttft_factor, err.itl_factor)
    used = [
        v * f / lim for v, f, lim in ((p.ttft, ft, lt), (p.itl, fi, li)) if v is not None and lim
    ]
    return max(used, default=0.0)


def breaks_at(points, limits_of, err: RegimeError) -> float | None:
    """Where the SLO breaks once the twin's error is added, from long-run points (``rate``,
    ``ok``, ``ttft``, ``itl``, ``slo_class``): the first point by rate that failed, or whose
    TTFT or ITL × its factor passes its limit; between it and the highest point below that
    held with the error, linear in the share of the limit used; × ``rate_factor``. None: no
    point broke, even with the error."""
    prev: tuple[float, float] | None = None
    for p in sorted(points, key=lambda q: q.rate):
        used = used_share(p, limits_of, err)
        if p.ok and used <= 1.0:
            prev = (p.rate, used)
            continue
        used = max(used, 1.0)
        if prev is None or used == float("inf"):
            rate = p.rate if prev is None else prev[0]
        else:
            r0, u0 = prev
            rate = r0 + (p.rate - r0) * (1.0 - u0) / (used - u0) if used > u0 else p.rate
        return rate * err.rate_factor
    return None
