"""How one (candidate, rate) is judged: the points to simulate and how their outcomes combine.

* ``ShortProbe`` — screening: one point, ``settings.window`` seconds (60) after the candidate's
  warm-up, seed ``settings.seed``, judged on the SLO alone. Cheap, and biased high near
  saturation: a queue that grows slowly is not seen in a minute.
* ``LongProbe`` — sustainability: one long point per seed (at least ``long_window`` seconds and
  ``long_e2e_multiple`` × the P99 end-to-end latency the screening saw, at least
  ``MIN_PERIODS`` whole burst periods, after a warm-up of at least ``long_warmup`` and twice that P99), each judged by ``sustain``'s criterion, with an early stop once the
  queue runs away; the rate holds only if it holds on every seed (``Sustained``).

A probe only says what to simulate; ``runner.Runner`` simulates it (in worker processes) and
the rate searches (``search.RateSearch``) decide which rate comes next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from . import sustain
from .profile import WorkloadProfile
from .search import (
    Candidate,
    CandidateResult,
    Outcome,
    PointSpec,
    SearchSettings,
    SLOTarget,
    point_timing,
)

MIN_PERIODS = 3
"""With bursts, a long window holds at least this many whole periods: its end (the last period)
is then judged against the same burst phase as the rest."""


@dataclass(slots=True)
class Sustained:
    """A rate judged on several seeds: it holds when every seed's long point holds. Reads like
    an ``Outcome`` (latency, throughput, the check in words) through its worst seed — the one
    that missed by most, or came closest to missing."""

    rate: float
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    @property
    def miss_share(self) -> float:
        return max(o.miss_share for o in self.outcomes)

    @property
    def worst(self) -> Outcome:
        return max(self.outcomes, key=lambda o: (not o.ok, o.miss_share, o.ttft or 0.0))

    @property
    def seeds(self) -> list[int]:
        return [o.seed for o in self.outcomes]

    @property
    def why(self) -> str:
        w = self.worst
        verdict = "holds" if self.ok else "fails"
        return (
            f"{verdict} on seeds {', '.join(map(str, self.seeds))}; worst, seed {w.seed}: {w.why}"
        )

    @property
    def wall(self) -> float:
        return sum(o.wall for o in self.outcomes)

    @property
    def cpu(self) -> float:
        return sum(o.cpu for o in self.outcomes)

    @property
    def max_in_flight(self) -> int:
        return max(o.max_in_flight for o in self.outcomes)

    # what a table shows of a point: the worst seed's
    summary = property(lambda self: self.worst.summary)
    ttft = property(lambda self: self.worst.ttft)
    itl = property(lambda self: self.worst.itl)
    slo_class = property(lambda self: self.worst.slo_class)
    per_class = property(lambda self: self.worst.per_class)
    duration = property(lambda self: self.worst.duration)
    warmup = property(lambda self: self.worst.warmup)
    seed = property(lambda self: self.worst.seed)

    @property
    def stopped_at(self) -> float | None:
        """The earliest early stop among the seeds (None: every run went to the end)."""
        return min((o.stopped_at for o in self.outcomes if o.stopped_at is not None), default=None)

    peak_kv_usage = property(lambda self: self.worst.peak_kv_usage)
    prefix_hit_rate = property(lambda self: self.worst.prefix_hit_rate)

    def to_dict(self) -> dict:
        return {
            "rate": self.rate,
            "slo_ok": self.ok,
            "check": self.why,
            "worst_seed": self.worst.seed,
            "seeds": [o.to_dict() for o in self.outcomes],
        }


class Probe(Protocol):
    def specs(self, cand: Candidate, rate: float) -> list[PointSpec]: ...

    def combine(self, rate: float, outcomes: list[Outcome]) -> Outcome | Sustained: ...


@dataclass(frozen=True, slots=True)
class ShortProbe:
    profile: WorkloadProfile
    settings: SearchSettings

    slo: SLOTarget | None = None
    """With a TTFT SLO, a point whose queue runs away stops early (``sustain.stop_bound``)."""

    def specs(self, cand: Candidate, rate: float) -> list[PointSpec]:
        duration, warmup = point_timing(self.profile, rate, self.settings.window, cand.warmup)
        stop = _stop(self.profile, self.slo, rate)
        return [PointSpec(rate, self.settings.seed, duration, warmup, stop_waiting=stop)]

    def combine(self, rate: float, outcomes: list[Outcome]) -> Outcome:
        return outcomes[0]


@dataclass(frozen=True, slots=True)
class LongProbe:
    profile: WorkloadProfile
    settings: SearchSettings
    slo: SLOTarget
    timing: dict[str, tuple[float, float]]
    """Candidate label -> (the least measured seconds, the warm-up) of its long points."""
    seeds: tuple[int, ...]
    """Absolute seeds."""

    def specs(self, cand: Candidate, rate: float) -> list[PointSpec]:
        base, warm = self.timing[cand.label]
        b = self.profile.burst
        period = b.period_at(rate, self.profile.nominal_rate) if b else None
        window = max(base, MIN_PERIODS * (period or 0.0))
        duration, warmup = point_timing(self.profile, rate, window, warm)
        stop = _stop(self.profile, self.slo, rate)
        return [PointSpec(rate, seed, duration, warmup, True, stop, period) for seed in self.seeds]

    def combine(self, rate: float, outcomes: list[Outcome]) -> Sustained:
        return Sustained(rate, list(outcomes))


def _stop(profile: WorkloadProfile, slo: SLOTarget | None, rate: float) -> int | None:
    if slo is None:
        return None
    return sustain.stop_bound(rate, slo.ttft, profile.burst.size if profile.burst else 0)


def long_timing(settings: SearchSettings, screened: CandidateResult) -> tuple[float, float]:
    """(least measured seconds, warm-up) of a candidate's long points. The window: at least
    ``long_window``, and ``long_e2e_multiple`` × the P99 end-to-end latency at its best screened
    rate (a queue that grows must have time to show it; every request must be many times
    inside the window). The warm-up: at least ``long_warmup``, the candidate's own, and twice
    that P99 (the fleet is full, in steady state, when the window starts)."""
    b = screened.best or screened.lowest
    e2e = (b.summary.e2e_latency.p99 or 0.0) if b is not None else 0.0
    window = max(settings.long_window, settings.long_e2e_multiple * e2e)
    warmup = max(settings.long_warmup, screened.candidate.warmup, 2 * e2e)
    return window, warmup


def seeds(base: int, offsets: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(base + k for k in offsets)
