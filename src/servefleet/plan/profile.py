"""What a workload asks of a server, measured on a sample of its requests (a dry run).

The planner never reasons about a workload's YAML: it draws requests from the same source the
simulator and the benchmark drive (``build_source`` + ``dry_run``) and measures them — prompt +
output lengths and their percentiles, how many prompt tokens repeat an earlier request's prefix
(what a prefix cache could serve), and bursts (requests that arrive at the same instant). So a
preset, a YAML file with ``empirical`` lengths, or a JSONL trace of observed requests are
profiled alike.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servefleet.workload import (
    RequestSpec,
    WorkloadError,
    WorkloadSpec,
    build_source,
    dry_run,
    load_workload,
    output_key,
)
from servefleet.workload.source import build_groups, nominal_rate

SAMPLE_REQUESTS = 3000
"""Requests drawn for the profile (percentiles of 3,000 draws: the 99th is the 30th largest)."""
BURST_MIN = 8
"""Requests at the same instant that count as a burst (Poisson arrivals never coincide)."""
CLOSED_PROFILE_CONCURRENCY = 16
"""A purely closed-loop workload is profiled with this many virtual users."""
DRY_RUN_LATENCY = 1.0
"""Seconds each request is taken to last in the dry run (it only moves sessions' later turns)."""


def load_any_workload(name_or_path: str, overrides: dict | None = None) -> WorkloadSpec:
    """A preset, a workload YAML (``empirical`` lengths included), ``trace:FILE``, or a JSONL
    trace of observed requests (``{"timestamp", "prompt_tokens", "output_tokens", ...}`` per
    line); ``overrides`` deep-merged on top (those of a trace need one)."""
    path = Path(name_or_path)
    if path.suffix == ".jsonl" and not name_or_path.startswith("trace:"):
        if not path.is_file():
            raise WorkloadError(f"{path}: trace file not found; check the path")
        name_or_path = f"trace:{path}"
    spec = load_workload(name_or_path)
    if overrides and "trace" in overrides and spec.trace is None:
        raise WorkloadError(
            "--time-scale, --max-requests and --trace-block-size apply to a trace only "
            "(--workload trace:FILE)"
        )
    return load_workload(name_or_path, overrides=overrides) if overrides else spec


@dataclass(frozen=True, slots=True)
class ClassProfile:
    name: str
    share: float
    """Share of the sampled requests."""
    mean_prompt: float
    mean_output: float
    max_total: int
    sessions: bool


@dataclass(frozen=True, slots=True)
class Burst:
    """The largest group of requests that arrived at one instant."""

    size: int
    classes: tuple[str, ...]
    prompt_tokens: tuple[int, ...]
    """Their prompt lengths, sorted ascending."""
    new_tokens: tuple[int, ...]
    """Their prompt tokens that no earlier request computed (what must be prefilled even with
    an unbounded prefix cache), sorted ascending."""
    share: float
    """Share of all sampled requests that arrived in a burst of >= BURST_MIN."""
    by_class: tuple[tuple[str, int], ...]
    """Sampled requests that arrived in bursts, per class."""
    period: float | None
    """Seconds between bursts at the workload's nominal rate (None: a single burst)."""

    def period_at(self, rate: float, nominal: float | None) -> float | None:
        """The period when the workload is scaled to ``rate`` (bursts keep their size)."""
        if self.period is None or not nominal:
            return None
        return self.period * nominal / rate


@dataclass(frozen=True, slots=True, eq=False)
class WorkloadProfile:
    name: str
    num_requests: int
    nominal_rate: float | None
    """Requests/s of the workload as written (None: a closed loop)."""
    prompts: np.ndarray
    outputs: np.ndarray
    shared: np.ndarray
    """Per request: leading prompt tokens that repeat an earlier request's prompt or answer
    (any cache size), before rounding to blocks."""
    class_names: np.ndarray
    """Per request: its class."""
    classes: tuple[ClassProfile, ...]
    burst: Burst | None
    trace_records: int | None = None
    """Records in the trace when the workload replays one."""
    notes: tuple[str, ...] = field(default=())

    @property
    def totals(self) -> np.ndarray:
        return self.prompts + self.outputs

    @property
    def mean_prompt(self) -> float:
        return float(self.prompts.mean())

    @property
    def mean_output(self) -> float:
        return float(self.outputs.mean())

    @property
    def mean_total(self) -> float:
        return float(self.totals.mean())

    def total_percentile(self, pct: float) -> int:
        """The ``pct``-th percentile of prompt + output tokens, an observed value (no
        interpolation: the smallest sampled length with at least pct % at or below it)."""
        return int(np.percentile(self.totals, pct, method="inverted_cdf"))

    def prompt_percentile(self, pct: float) -> int:
        return int(np.percentile(self.prompts, pct, method="inverted_cdf"))

    def coverage(self, max_model_len: int) -> float:
        """Share of requests whose prompt + output fit in ``max_model_len``."""
        return float((self.totals <= max_model_len).mean())

    def shared_fraction(self, block_size: int) -> float:
        """Prompt tokens a prefix cache of unbounded size could serve ÷ all prompt tokens:
        the repeated prefix in full blocks, never the whole prompt (the last token is always
        computed, as in vLLM)."""
        hit = np.minimum(self.shared, self.prompts - 1) // block_size * block_size
        return float(hit.sum() / self.prompts.sum())

    def mask(self, classes: frozenset[str] | None) -> np.ndarray:
        """Requests of ``classes`` (None: all)."""
        if classes is None:
            return np.ones(self.num_requests, dtype=bool)
        return np.isin(self.class_names, sorted(classes))

    def new_tokens(self) -> np.ndarray:
        """Per request: prompt tokens no earlier request computed (at least one)."""
        return self.prompts - np.minimum(self.shared, self.prompts - 1)

    def burst_share(self, classes: frozenset[str] | None = None) -> float:
        """Share of the requests of ``classes`` (None: all) that arrive in bursts."""
        if self.burst is None:
            return 0.0
        scope = [c for c in self.classes if classes is None or c.name in classes]
        total = sum(c.share for c in scope) * self.num_requests
        hit = sum(n for name, n in self.burst.by_class if classes is None or name in classes)
        return hit / total if total else 0.0

    @property
    def has_sessions(self) -> bool:
        return any(c.sessions for c in self.classes)

    def to_dict(self, block_size: int = 16) -> dict:
        return {
            "name": self.name,
            "sampled_requests": self.num_requests,
            "nominal_rate": self.nominal_rate,
            "mean_prompt": self.mean_prompt,
            "mean_output": self.mean_output,
            "prompt_plus_output": {
                f"p{p}": self.total_percentile(p) for p in (50, 90, 95, 99, 100)
            },
            "shared_prefix_fraction": self.shared_fraction(block_size),
            "classes": [
                {
                    "name": c.name,
                    "share": c.share,
                    "mean_prompt": c.mean_prompt,
                    "mean_output": c.mean_output,
                    "max_prompt_plus_output": c.max_total,
                    "sessions": c.sessions,
                }
                for c in self.classes
            ],
            "burst": None
            if self.burst is None
            else {
                "size": self.burst.size,
                "classes": list(self.burst.classes),
                "prompt_tokens_total": sum(self.burst.prompt_tokens),
                "share_of_requests": self.burst.share,
                "period_at_nominal_rate": self.burst.period,
            },
            "trace_records": self.trace_records,
        }


def profile_workload(
    spec: WorkloadSpec, *, seed: int = 0, sample: int = SAMPLE_REQUESTS
) -> WorkloadProfile:
    """Draw about ``sample`` requests of ``spec`` (as written) and measure them."""
    reqs, nominal, trace_n = _sample(spec, seed, sample)
    if not reqs:
        raise WorkloadError(f"workload {spec.name!r} sends no request to profile")
    prompts = np.array([r.prompt_tokens for r in reqs], dtype=np.int64)
    outputs = np.array([r.max_tokens for r in reqs], dtype=np.int64)
    shared = np.array(_shared_prefixes(reqs), dtype=np.int64)
    return WorkloadProfile(
        name=spec.name,
        num_requests=len(reqs),
        nominal_rate=nominal,
        prompts=prompts,
        outputs=outputs,
        shared=shared,
        class_names=np.array([r.class_name for r in reqs]),
        classes=_classes(reqs),
        burst=_burst(reqs, shared),
        trace_records=trace_n,
    )


def _sample(spec: WorkloadSpec, seed: int, sample: int):
    if spec.trace is not None:
        source = build_source(spec, seed=seed)
        reqs = dry_run(source, until=math.inf, latency=DRY_RUN_LATENCY)
        return reqs, _trace_rate(reqs), len(reqs)
    nominal = nominal_rate(build_groups(spec))
    if nominal > 0:
        source = build_source(spec, seed=seed)
        until = sample / nominal
    else:
        c = CLOSED_PROFILE_CONCURRENCY
        source = build_source(spec, seed=seed, concurrency=c)
        until = sample * DRY_RUN_LATENCY / c
    reqs = dry_run(source, until=until, latency=DRY_RUN_LATENCY)
    return reqs, (nominal or None), None


def _trace_rate(reqs: list[RequestSpec]) -> float | None:
    span = reqs[-1].arrival_time - reqs[0].arrival_time if reqs else 0.0
    return (len(reqs) - 1) / span if span > 0 else None


def _shared_prefixes(reqs: list[RequestSpec]) -> list[int]:
    """For each request (in send order), the tokens of its longest leading run of segments that
    an earlier request already put in the cache: an earlier prompt's prefix, or an earlier
    prompt followed by that request's own answer (a session's history)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for r in reqs:
        keys, shared, length = [], 0, 0
        hit = True
        for seg in r.prompt:
            keys.append(seg.key)
            length += seg.length
            if hit and tuple(keys) in seen:
                shared = length
            else:
                hit = False
        out.append(shared)
        for i in range(1, len(keys) + 1):
            seen.add(tuple(keys[:i]))
        seen.add((*keys, output_key(r.request_id)))
    return out


def _classes(reqs: list[RequestSpec]) -> tuple[ClassProfile, ...]:
    by: dict[str, list[RequestSpec]] = defaultdict(list)
    for r in reqs:
        by[r.class_name].append(r)
    n = len(reqs)
    return tuple(
        ClassProfile(
            name,
            len(rs) / n,
            float(np.mean([r.prompt_tokens for r in rs])),
            float(np.mean([r.max_tokens for r in rs])),
            max(r.prompt_tokens + r.max_tokens for r in rs),
            any(r.session_id is not None for r in rs),
        )
        for name, rs in by.items()
    )


def _burst(reqs: list[RequestSpec], shared: np.ndarray) -> Burst | None:
    counts = Counter(r.arrival_time for r in reqs)
    times = {t for t, c in counts.items() if c >= BURST_MIN}
    if not times:
        return None
    biggest = max(times, key=lambda t: (counts[t], -t))
    members = [i for i, r in enumerate(reqs) if r.arrival_time == biggest]
    ordered = sorted(times)
    period = float(np.median(np.diff(ordered))) if len(ordered) > 1 else None
    in_bursts = Counter(r.class_name for r in reqs if r.arrival_time in times)
    return Burst(
        size=len(members),
        classes=tuple(sorted({reqs[i].class_name for i in members})),
        prompt_tokens=tuple(sorted(reqs[i].prompt_tokens for i in members)),
        new_tokens=tuple(
            sorted(
                reqs[i].prompt_tokens - min(int(shared[i]), reqs[i].prompt_tokens - 1)
                for i in members
            )
        ),
        share=sum(in_bursts.values()) / len(reqs),
        by_class=tuple(sorted(in_bursts.items())),
        period=period,
    )
