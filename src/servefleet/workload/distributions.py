"""Length distributions: how many tokens a prompt or an output has.

Each is a small frozen object with ``sample(rng)`` (one int >= 1) and ``mean()``. Continuous
distributions are rounded to the nearest integer and clipped to ``[low, high]`` (``low`` >= 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_MEAN_SAMPLES = 200_000  # Monte-Carlo size for the mean of clipped distributions


def _clip(x: float, low: int, high: int | None) -> int:
    n = max(low, round(x))
    return n if high is None else min(n, high)


def _mc_mean(dist: Normal | LogNormal) -> float:
    """The mean after rounding and clipping, estimated with a fixed seed (deterministic)."""
    rng = np.random.default_rng(0)
    x = np.rint(dist.raw(rng, _MEAN_SAMPLES))
    return float(np.clip(x, dist.low, dist.high if dist.high is not None else np.inf).mean())


@dataclass(frozen=True, slots=True)
class Fixed:
    value: int

    def sample(self, rng: np.random.Generator) -> int:
        return self.value

    def mean(self) -> float:
        return float(self.value)

    def describe(self) -> str:
        return f"{self.value}"


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers from ``low`` to ``high``, both included, equally likely."""

    low: int
    high: int

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.low, self.high + 1))

    def mean(self) -> float:
        return (self.low + self.high) / 2

    def describe(self) -> str:
        return f"uniform {self.low}..{self.high}"


@dataclass(frozen=True, slots=True)
class Normal:
    """``mean`` ± ``sd``, rounded, clipped to ``[low, high]``."""

    mu: float
    sd: float
    low: int = 1
    high: int | None = None

    def raw(self, rng: np.random.Generator, size: int | None = None):
        return rng.normal(self.mu, self.sd, size)

    def sample(self, rng: np.random.Generator) -> int:
        return _clip(self.raw(rng), self.low, self.high)

    def mean(self) -> float:
        return _mc_mean(self)

    def describe(self) -> str:
        return f"normal {self.mu:g}±{self.sd:g}"


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A log-normal whose *lengths* have mean ``mu`` and standard deviation ``sd``."""

    mu: float
    sd: float
    low: int = 1
    high: int | None = None

    def _log_params(self) -> tuple[float, float]:
        s2 = math.log1p((self.sd / self.mu) ** 2)
        return math.log(self.mu) - s2 / 2, math.sqrt(s2)

    def raw(self, rng: np.random.Generator, size: int | None = None):
        m, s = self._log_params()
        return rng.lognormal(m, s, size)

    def sample(self, rng: np.random.Generator) -> int:
        return _clip(self.raw(rng), self.low, self.high)

    def mean(self) -> float:
        return _mc_mean(self)

    def describe(self) -> str:
        return f"lognormal {self.mu:g}±{self.sd:g}"


@dataclass(frozen=True, slots=True, eq=False)
class Empirical:
    """Observed lengths, each equally likely (sampling with replacement)."""

    values: np.ndarray
    source: str = ""

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.values[rng.integers(len(self.values))])

    def mean(self) -> float:
        return float(self.values.mean())

    def describe(self) -> str:
        return f"empirical({len(self.values)} values)"


LengthDist = Fixed | Uniform | Normal | LogNormal | Empirical


@dataclass(frozen=True, slots=True)
class IndependentLengths:
    """Prompt and output lengths drawn independently."""

    prompt: LengthDist
    output: LengthDist

    def sample(self, rng: np.random.Generator) -> tuple[int, int]:
        return self.prompt.sample(rng), self.output.sample(rng)

    def mean(self) -> tuple[float, float]:
        return self.prompt.mean(), self.output.mean()


@dataclass(frozen=True, slots=True, eq=False)
class PairedLengths:
    """(prompt, output) pairs observed together (a dataset), each pair equally likely."""

    prompts: np.ndarray
    outputs: np.ndarray

    def sample(self, rng: np.random.Generator) -> tuple[int, int]:
        i = rng.integers(len(self.prompts))
        return int(self.prompts[i]), int(self.outputs[i])

    def mean(self) -> tuple[float, float]:
        return float(self.prompts.mean()), float(self.outputs.mean())


LengthPairs = IndependentLengths | PairedLengths
