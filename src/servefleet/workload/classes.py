"""A request class at run time: what one unit of work of that class looks like.

A *unit* is what one arrival starts: a single request, or a whole multi-turn session. The class
plans the unit when it starts (every length, think time and the system prompt are drawn then, from
the generator of whoever starts it), so the content of a session never depends on the order in
which its turns happen to finish.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .distributions import LengthDist, LengthPairs
from .types import Segment


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    """With probability ``share`` a unit starts with one of ``groups`` shared prompts."""

    tokens: int
    share: float
    groups: int
    pool: str  # segment keys are "sys:<pool>:<g>"

    def draw(self, rng: np.random.Generator) -> Segment | None:
        if self.share < 1.0 and rng.random() >= self.share:
            return None
        g = int(rng.integers(self.groups)) if self.groups > 1 else 0
        return Segment(f"sys:{self.pool}:{g}", self.tokens, "system")


@dataclass(frozen=True, slots=True)
class SessionShape:
    turns: LengthDist
    think_time_mean: float


@dataclass(slots=True)
class Unit:
    """A planned unit: the i-th turn sends ``turns[i]`` = (new user tokens, max_tokens) and turn
    i+1 arrives ``thinks[i]`` seconds after turn i finishes."""

    class_name: str
    system: Segment | None
    turns: list[tuple[int, int]]
    thinks: list[float]
    is_session: bool
    user_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestClass:
    name: str
    weight: float
    lengths: LengthPairs
    system_prompt: SystemPrompt | None = None
    session: SessionShape | None = None

    def mean_turns(self) -> float:
        return self.session.turns.mean() if self.session else 1.0

    def plan(self, rng: np.random.Generator, users: int | None) -> Unit:
        system = self.system_prompt.draw(rng) if self.system_prompt else None
        session = self.session
        n = session.turns.sample(rng) if session else 1
        turns = [self.lengths.sample(rng) for _ in range(n)]
        # without a session n is 1: no think time is drawn
        think_mean = session.think_time_mean if session else 0.0
        thinks = [float(rng.exponential(think_mean)) for _ in range(n - 1)]
        user = f"u{int(rng.integers(users))}" if users else None
        return Unit(self.name, system, turns, thinks, self.session is not None, user)
