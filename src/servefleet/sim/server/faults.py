"""Injected faults, for the tests of the gateway, the benchmark and the launcher.

Set at start with ``--fault-*`` flags or at run time with ``POST /admin/faults`` (guarded by
``--admin-token``):

* ``slowdown``: every engine step lasts this many times longer (1 = as modelled);
* ``fail_fraction``: this fraction of generation requests is answered with HTTP 500 (vLLM's
  error body, type ``InternalServerError``) instead of being served; seeded by ``--seed``;
* ``stall_seconds``: from now on, no step runs and no token is delivered for this long
  (``/health`` still answers, as a hung vLLM's API server does);
* ``fail_matching``: a generation request whose prompt (or last message) contains this text
  is answered with HTTP 500, every time (a request no replica can serve: a "query of death");
* ``exit_after_tokens``: the process exits (status ``FAULT_EXIT_CODE``, no clean shutdown:
  connections are cut) right after any sequence has delivered this many output tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

FAULT_EXIT_CODE = 3


class FaultUpdate(BaseModel):
    """Body of ``POST /admin/faults``; fields left out stay as they are."""

    model_config = ConfigDict(extra="forbid")

    slowdown: float | None = Field(default=None, gt=0, le=1000)
    fail_fraction: float | None = Field(default=None, ge=0, le=1)
    stall_seconds: float | None = Field(default=None, ge=0, le=3600)
    exit_after_tokens: int | None = Field(default=None, ge=1)
    fail_matching: str | None = None
    reset: bool = False
    """Clear every fault first."""


@dataclass
class Faults:
    slowdown: float = 1.0
    fail_fraction: float = 0.0
    stall_until: float = 0.0
    """Clock time until which the engine loop is stalled."""
    exit_after_tokens: int | None = None
    fail_matching: str | None = None
    rng: random.Random = field(default_factory=random.Random)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by every update: wakes a loop waiting out a stall that was shortened or lifted."""

    def should_fail(self, text: str = "") -> bool:
        if self.fail_matching and self.fail_matching in text:
            return True
        return self.fail_fraction > 0 and self.rng.random() < self.fail_fraction

    def apply(self, update: FaultUpdate, now: float) -> None:
        if update.reset:
            self.slowdown, self.fail_fraction, self.stall_until = 1.0, 0.0, 0.0
            self.exit_after_tokens = self.fail_matching = None
        if update.slowdown is not None:
            self.slowdown = update.slowdown
        if update.fail_fraction is not None:
            self.fail_fraction = update.fail_fraction
        if update.stall_seconds is not None:
            self.stall_until = now + update.stall_seconds if update.stall_seconds else 0.0
        if "fail_matching" in update.model_fields_set:
            self.fail_matching = update.fail_matching or None
        if "exit_after_tokens" in update.model_fields_set:
            self.exit_after_tokens = update.exit_after_tokens
        self.changed.set()

    async def wait_out_stall(self, clock) -> None:
        """Return when no stall holds: at its end, or as soon as an update lifts it."""
        while (left := self.stall_until - clock()) > 0:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.changed.wait()

    def describe(self, now: float) -> dict[str, float | int | None]:
        return {
            "slowdown": self.slowdown,
            "fail_fraction": self.fail_fraction,
            "stall_remaining_seconds": max(0.0, self.stall_until - now),
            "exit_after_tokens": self.exit_after_tokens,
            "fail_matching": self.fail_matching,
        }
