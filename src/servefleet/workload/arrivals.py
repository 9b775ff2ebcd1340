"""Arrival processes: *when* new work starts.

An open-loop process yields absolute times (seconds since the start of the run) from
``times(rng)``, non-decreasing and possibly forever. Each time is computed from the start of the
run, never from the previous send, so a late send does not push the rest of the schedule (no
drift). ``rate`` is the long-run mean number of arrivals per second and ``scaled(f)`` multiplies it
by ``f`` keeping the shape. ``Closed`` is the one closed-loop process: it has no times of its own
(``concurrency`` users start at t=0 and each starts again when its work finishes; the source
drives it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count

import numpy as np

_CHUNK = 1024  # gaps drawn per numpy call


def _renewal(rng: np.random.Generator, draw) -> Iterator[float]:
    """Times of a renewal process whose gaps come from ``draw(rng, n)``: t_k = gap_1 + ... + gap_k."""
    t = 0.0
    while True:
        ts = t + np.cumsum(draw(rng, _CHUNK))
        yield from ts.tolist()
        t = float(ts[-1])


@dataclass(frozen=True, slots=True)
class Poisson:
    """Exponential gaps of mean 1/rate."""

    rate: float

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        return _renewal(rng, lambda r, n: r.exponential(1.0 / self.rate, n))

    def scaled(self, f: float) -> Poisson:
        return Poisson(self.rate * f)

    def describe(self) -> str:
        return f"poisson {self.rate:.4g}/s"


@dataclass(frozen=True, slots=True)
class Gamma:
    """Gamma gaps of mean 1/rate and squared coefficient of variation ``burstiness``.

    burstiness = CV² of the gaps: 1 is Poisson, > 1 burstier, < 1 smoother. (vLLM's
    ``--burstiness`` is the gamma *shape*, the inverse of this: ours = 1 / theirs.)
    """

    rate: float
    burstiness: float = 1.0

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        shape, scale = 1.0 / self.burstiness, self.burstiness / self.rate
        return _renewal(rng, lambda r, n: r.gamma(shape, scale, n))

    def scaled(self, f: float) -> Gamma:
        return Gamma(self.rate * f, self.burstiness)

    def describe(self) -> str:
        return f"gamma {self.rate:.4g}/s CV²={self.burstiness:g}"


@dataclass(frozen=True, slots=True)
class Constant:
    """One arrival every 1/rate seconds, the first at t=0: t_k = k / rate."""

    rate: float

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        return (k / self.rate for k in count())

    def scaled(self, f: float) -> Constant:
        return Constant(self.rate * f)

    def describe(self) -> str:
        return f"constant {self.rate:.4g}/s"


@dataclass(frozen=True, slots=True)
class Bursts:
    """``count`` arrivals at the same instant every ``period`` seconds, the first burst at t=0."""

    count: int
    period: float

    @property
    def rate(self) -> float:
        return self.count / self.period

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        for k in count():
            t = k * self.period
            for _ in range(self.count):
                yield t

    def scaled(self, f: float) -> Bursts:
        return Bursts(self.count, self.period / f)

    def describe(self) -> str:
        return f"bursts of {self.count} every {self.period:.4g} s"


@dataclass(frozen=True, slots=True)
class Ramp:
    """Rate rising (or falling) linearly from ``start_rate`` to ``end_rate`` over ``duration``,
    then holding at ``end_rate`` (a rate of 0 ends the process).

    Times are the unit-rate events s_k mapped through the inverse of the cumulative rate
    Λ(t) = r0·t + (r1 - r0)·t²/(2D): with ``poisson`` the s_k are a unit Poisson process (an exact
    inhomogeneous Poisson process), otherwise s_k = k (evenly spaced in Λ, the first at t=0).
    ``rate`` is the mean rate over the ramp, (r0 + r1) / 2.
    """

    start_rate: float
    end_rate: float
    duration: float
    poisson: bool = True

    @property
    def rate(self) -> float:
        return (self.start_rate + self.end_rate) / 2

    def _inverse(self, s: float) -> float:
        r0, r1, d = self.start_rate, self.end_rate, self.duration
        total = d * (r0 + r1) / 2
        if s > total:
            return d + (s - total) / r1 if r1 > 0 else math.inf
        if s == 0.0:
            return 0.0
        a = (r1 - r0) / (2 * d)
        return 2 * s / (r0 + math.sqrt(max(r0 * r0 + 4 * a * s, 0.0)))  # stable root of a·t²+r0·t=s

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        units = _renewal(rng, lambda r, n: r.exponential(1.0, n)) if self.poisson else count()
        for s in units:
            t = self._inverse(float(s))
            if math.isinf(t):
                return
            yield t

    def scaled(self, f: float) -> Ramp:
        return Ramp(self.start_rate * f, self.end_rate * f, self.duration, self.poisson)

    def describe(self) -> str:
        return f"ramp {self.start_rate:.4g}→{self.end_rate:.4g}/s over {self.duration:g} s"


@dataclass(frozen=True, slots=True)
class Closed:
    """A closed loop: ``concurrency`` users start at t=0; each starts anew when its work finishes."""

    concurrency: int

    def describe(self) -> str:
        return f"closed loop of {self.concurrency}"


OpenProcess = Poisson | Gamma | Constant | Bursts | Ramp
ArrivalProcess = OpenProcess | Closed
