"""The workload source: arrival processes feeding request classes, merged in time order.

A *group* is one arrival process and the classes it feeds: a class's own ``arrival``, or the
workload's default shared by every class without one. On each arrival an open group draws a class
with probability ∝ weight / mean turns (so that ``weight`` is the class's share of *requests*,
every turn of a session counted) and starts a unit: one request, or a whole session.

A closed group is N virtual users. Each runs one unit at a time: it draws a class, sends the unit's
turns one after the other (think times included), and the moment its last turn finishes it starts
the next unit. So at most N requests are in flight, exactly N when no class has sessions; a
session keeps its user's slot through its think times.

Randomness: one generator per component, seeded from (seed, component name): the times of each
group, the class draws of each group, the content of each class (open loop), and each virtual
user (closed loop). Every unit is planned in full when it starts, so the same seed gives the same
requests whatever order the runner reports finishes in (ids included, open loop).
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count

import numpy as np

from .arrivals import ArrivalProcess, Closed
from .classes import RequestClass, Unit
from .datasets import TokenCounter, whitespace_tokens
from .errors import WorkloadError
from .sessions import first_request, next_request, root_of
from .spec import WorkloadSpec
from .trace import TraceSource, native_rate
from .types import RequestSpec, WorkloadSource


def _rng(seed: int, *parts: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(p.encode()) for p in parts)])


@dataclass(frozen=True, slots=True)
class Group:
    key: str
    process: ArrivalProcess
    classes: tuple[RequestClass, ...]

    @property
    def closed(self) -> bool:
        return isinstance(self.process, Closed)

    def probabilities(self) -> np.ndarray:
        """Per-unit draw probabilities, ∝ weight / mean turns."""
        p = np.array([c.weight / c.mean_turns() for c in self.classes])
        return p / p.sum()

    def draw(self, rng: np.random.Generator, cum: np.ndarray) -> RequestClass:
        if len(self.classes) == 1:
            return self.classes[0]
        return self.classes[min(int(np.searchsorted(cum, rng.random(), "right")), len(cum) - 1)]

    def request_rates(self) -> dict[str, float]:
        """Requests/s of each class (open loop; every turn counted)."""
        p = self.probabilities()
        units = self.process.rate  # type: ignore[union-attr]
        return {c.name: units * pi * c.mean_turns() for c, pi in zip(self.classes, p, strict=True)}


@dataclass(slots=True)
class _Live:
    unit: Unit
    group: Group | None = None  # closed loop only
    user: int = -1


class SyntheticSource:
    """A ``WorkloadSource`` over groups of classes (see the module docstring)."""

    def __init__(self, groups: list[Group], *, seed: int, users: int | None = None):
        if not isinstance(seed, int) or seed < 0:
            raise WorkloadError(f"seed must be an integer >= 0, got {seed!r}")
        self.groups, self.seed, self.users = groups, seed, users
        self._cum = {g.key: np.cumsum(g.probabilities()) for g in groups}
        self._reset()

    def _reset(self) -> None:
        self._live: dict[str, _Live] = {}  # units with turns still to come, or closed-loop users
        self._user_rngs: list[np.random.Generator] = []
        self._user_units: list[int] = []

    def initial(self) -> Iterator[RequestSpec]:
        """Closed-loop users' first requests (t=0), then the open groups merged in time order.
        Calling it again restarts the run from scratch."""
        self._reset()
        first = [
            self._start_user(g)
            for g in self.groups
            if isinstance(g.process, Closed)  # g.closed
            for _ in range(g.process.concurrency)
        ]
        opened = [g for g in self.groups if not g.closed]
        return self._merge(first, opened)

    def _merge(self, first: list[RequestSpec], opened: list[Group]) -> Iterator[RequestSpec]:
        yield from first
        streams = [self._stream(i, g) for i, g in enumerate(opened)]
        numbers = count()
        for t, _, _, unit in heapq.merge(*streams):
            yield self._start(unit, f"r{next(numbers):06d}", t)

    def _stream(self, index: int, g: Group) -> Iterator[tuple[float, int, int, Unit]]:
        times, choose = _rng(self.seed, "times", g.key), _rng(self.seed, "choose", g.key)
        content = {c.name: _rng(self.seed, "class", c.name) for c in g.classes}
        cum = self._cum[g.key]
        for seq, t in enumerate(g.process.times(times)):  # type: ignore[union-attr]
            cls = g.draw(choose, cum)
            yield t, index, seq, cls.plan(content[cls.name], self.users)

    def _start(self, unit: Unit, root: str, t: float, live: _Live | None = None) -> RequestSpec:
        spec = first_request(unit, root, t)
        if live is not None or len(unit.turns) > 1:
            self._live[root] = live or _Live(unit)
        return spec

    def _start_user(self, g: Group, t: float = 0.0, user: int | None = None) -> RequestSpec:
        if user is None:
            user = len(self._user_rngs)
            self._user_rngs.append(_rng(self.seed, "user", str(user)))
            self._user_units.append(0)
        rng, k = self._user_rngs[user], self._user_units[user]
        self._user_units[user] += 1
        unit = g.draw(rng, self._cum[g.key]).plan(rng, self.users)
        unit.user_id = unit.user_id or f"u{user:04d}"
        return self._start(unit, f"u{user:04d}-{k:06d}", t, _Live(unit, g, user))

    def on_finish(
        self, spec: RequestSpec, finish_time: float, output_tokens: int
    ) -> list[RequestSpec]:
        if output_tokens < 0:
            raise ValueError(f"{spec.request_id}: output_tokens must be >= 0, got {output_tokens}")
        root = root_of(spec.request_id)
        live = self._live.get(root)
        if live is None:
            return []
        nxt = next_request(live.unit, spec, finish_time, output_tokens)
        if nxt is not None:
            return [nxt]
        del self._live[root]
        if live.group is None:
            return []
        return [self._start_user(live.group, finish_time, live.user)]


# ---- building ---------------------------------------------------------------------------------


def build_groups(spec: WorkloadSpec, count_tokens: TokenCounter = whitespace_tokens) -> list[Group]:
    classes = {n: c.build(n, spec.name, count_tokens) for n, c in spec.classes.items()}
    shared = tuple(classes[n] for n, c in spec.classes.items() if c.arrival is None)
    groups = [Group("default", spec.arrival.build(), shared)] if shared else []  # type: ignore[union-attr]
    for n, c in spec.classes.items():
        if c.arrival is not None:
            groups.append(Group(f"class:{n}", c.arrival.build(), (classes[n],)))
    return groups


def nominal_rate(groups: list[Group]) -> float:
    """Mean requests/s of the open-loop groups (every turn of a session counted)."""
    # lists, not generators: the builtin sum of floats (cost_model.CostModel.linear_time)
    return sum([sum(g.request_rates().values()) for g in groups if not g.closed])


def _scale(groups: list[Group], rate: float) -> list[Group]:
    nominal = nominal_rate(groups)
    if nominal <= 0:
        raise WorkloadError(
            "rate applies to open-loop arrivals and this workload is a closed loop; pass concurrency instead"
        )
    f = rate / nominal
    return [g if g.closed else Group(g.key, g.process.scaled(f), g.classes) for g in groups]  # type: ignore[union-attr]


def build_source(
    spec: WorkloadSpec,
    *,
    seed: int,
    rate: float | None = None,
    concurrency: int | None = None,
    count_tokens: TokenCounter = whitespace_tokens,
) -> WorkloadSource:
    """The source a run drives. ``rate`` (requests/s, every turn counted) scales every open-loop
    process by the same factor, keeping the mix; ``concurrency`` replaces all arrivals by one
    closed loop of that many virtual users drawing classes by weight."""
    if rate is not None and concurrency is not None:
        raise WorkloadError("give rate (open loop) or concurrency (closed loop), not both")
    if rate is not None and not rate > 0:
        raise WorkloadError(f"rate must be > 0 requests/s, got {rate}")
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise WorkloadError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    if spec.trace is not None:
        return _trace_source(spec, rate, concurrency)
    groups = build_groups(spec, count_tokens)
    if concurrency is not None:
        every = tuple(c for g in groups for c in g.classes)
        groups = [Group("closed", Closed(concurrency), every)]
    elif rate is not None:
        groups = _scale(groups, rate)
    return SyntheticSource(groups, seed=seed, users=spec.users)


def recorded_rate(spec: WorkloadSpec) -> float | None:
    """Requests/s of a trace replayed as written (its ``time_scale`` applied): the ``rate=``
    that replays it at its recorded times; None if it spans no time."""
    assert spec.trace is not None
    native = native_rate(spec.trace.records())
    return None if native is None else native / spec.trace.time_scale


def _trace_source(spec: WorkloadSpec, rate: float | None, concurrency: int | None) -> TraceSource:
    trace = spec.trace
    assert trace is not None  # build_source calls it only for a trace
    records = trace.records()
    scale = trace.time_scale
    if rate is not None:
        native = native_rate(records)
        if native is None:
            raise WorkloadError(
                f"{trace.path}: the trace spans no time, so it has no rate to scale"
            )
        scale = native / rate  # recorded gaps stretched so the replay runs at `rate`
    return TraceSource(records, scale=scale, concurrency=concurrency, block_size=trace.block_size)
