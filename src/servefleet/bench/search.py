"""SLO search: the highest request rate whose SLOs hold — doubling, then bisection. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SloSearch:
    """Ask ``next_rate()``, run it, ``report(rate, held)``; until ``next_rate()`` is None.

    Doubling from ``start`` until a rate fails (halving instead while even ``start`` fails),
    then bisection between the highest rate that held and the lowest that failed, until they
    are within ``tolerance`` (relative) or ``max_points`` points were run."""

    start: float = 1.0
    tolerance: float = 0.1
    max_points: int = 12
    max_rate: float = 1e6
    min_rate: float = 1e-3
    passed: float | None = None
    failed: float | None = None
    steps: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.start > 0:
            raise ValueError(f"the search's start rate must be > 0, got {self.start}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {self.tolerance}")

    def next_rate(self) -> float | None:
        if len(self.steps) >= self.max_points:
            return None
        if self.failed is None:
            r = self.start if self.passed is None else self.passed * 2
            return r if r <= self.max_rate else None
        if self.passed is None:
            r = self.failed / 2
            return r if r >= self.min_rate else None
        if (self.failed - self.passed) / self.failed <= self.tolerance:
            return None
        return (self.passed + self.failed) / 2

    def report(self, rate: float, held: bool) -> None:
        self.steps.append((rate, held))
        if held:
            self.passed = rate if self.passed is None else max(self.passed, rate)
        else:
            self.failed = rate if self.failed is None else min(self.failed, rate)

    @property
    def result(self) -> float | None:
        """The highest rate that held (None if none did)."""
        return self.passed

    def to_dict(self) -> dict:
        return {
            "start": self.start,
            "tolerance": self.tolerance,
            "steps": [{"rate": r, "held": h} for r, h in self.steps],
            "highest_rate_held": self.passed,
            "lowest_rate_failed": self.failed,
        }
