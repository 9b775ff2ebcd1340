"""Many rate searches at once, their points simulated in worker processes.

Each candidate's search is sequential (the next rate depends on the last verdict), so up to
``jobs`` candidates advance together; a probe's points (one per seed) are simulated together
too. Rounds are recorded in candidate order: what is simulated next depends only on what came
back, never on which worker finished first, so the same inputs give the same plan.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from servefleet.workload import WorkloadSpec

from .probes import Probe, Sustained
from .profile import WorkloadProfile
from .search import (
    Candidate,
    CandidateResult,
    Outcome,
    PointSpec,
    RateSearch,
    SearchSettings,
    SLOTarget,
    Task,
    evaluate,
)

DEFAULT_JOBS = 2

_context: tuple | None = None  # a worker's (workload, slo)


def _init_worker(context: tuple) -> None:
    global _context
    _context = context


def _worker(cand: Candidate, spec: PointSpec) -> Outcome:
    workload, slo = _context
    return evaluate(cand, workload, spec, slo)


def _noop(_: int) -> None:
    return None


Judged = Outcome | Sustained


class Runner:
    """Simulates points in ``jobs`` worker processes (1: in this process). ``jobs`` shapes the
    search path (which candidates start seeded), so it is fixed by default, not the CPU
    count: the same inputs give the same plan on any machine."""

    def __init__(
        self,
        workload: WorkloadSpec,
        profile: WorkloadProfile,
        slo: SLOTarget,
        settings: SearchSettings,
        jobs: int | None = None,
    ) -> None:
        self.workload, self.profile, self.slo, self.settings = workload, profile, slo, settings
        self.jobs = max(1, jobs if jobs is not None else DEFAULT_JOBS)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Runner:
        if self.jobs > 1:
            # never forked from this process: it may run display threads (the CLI's progress,
            # the demo's), and a fork keeps their locks held for ever (sim.command.point_pool)
            methods = mp.get_all_start_methods()
            ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
            if ctx.get_start_method() == "forkserver":
                ctx.set_forkserver_preload([__name__])
            self._pool = ProcessPoolExecutor(
                self.jobs,
                mp_context=ctx,
                initializer=_init_worker,
                initargs=((self.workload, self.slo),),
            )
            # start the workers now (the fork server's start and imports, once)
            list(self._pool.map(_noop, range(self.jobs)))
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def simulate(self, jobs: Sequence[tuple[Candidate, PointSpec]]) -> list[Outcome]:
        """Every point of ``jobs``, in the pool (or here), outcomes in the same order."""
        if self._pool is None:
            return [evaluate(c, self.workload, s, self.slo) for c, s in jobs]
        futures = [self._pool.submit(_worker, c, s) for c, s in jobs]
        return [f.result() for f in futures]

    def judge(self, probe: Probe, cand: Candidate, rate: float) -> Judged:
        """One probe of ``cand`` at ``rate`` (also outside any search)."""
        return probe.combine(rate, self.simulate([(cand, s) for s in probe.specs(cand, rate)]))

    def run(
        self,
        tasks: Sequence[Task],
        probe: Probe | Sequence[Probe],
        *,
        prune: bool = False,
        seed: bool = False,
        on_point: Callable[[str, Judged], None] | None = None,
    ) -> list[CandidateResult]:
        """Run every task's search. ``prune``: stop bisecting a candidate whose bracket lies
        below the best rate found so far ÷ (1 + rel_tol) — it can neither win nor tie.
        ``seed``: a candidate that starts after some rate is known to hold starts at that rate
        ÷ (1 + rel_tol), the least it needs to tie, and is given up if it misses there; it
        climbs by 1.1, 1.21, 1.46, ... if it holds. Candidates already started have priority
        over new ones, so that the bar is known early. ``probe``: one for every task, or one
        per task."""
        probes = list(probe) if isinstance(probe, Sequence) else [probe] * len(tasks)
        lowest = self.settings.lowest_rate(self.profile)
        searches: list[RateSearch | None] = [None] * len(tasks)
        walls = [0.0] * len(tasks)
        factor = 1 + self.settings.rel_tol

        def best_lo() -> float:
            return max((s.lo for s in searches if s is not None and s.lo is not None), default=0.0)

        def begin(i: int) -> RateSearch:
            t, bar = tasks[i], best_lo()
            if seed and bar > 0:  # it must reach bar / (1 + tol) to tie: try that first
                t = Task(t.candidate, bar / factor, factor, max_down=0, accelerate=True)
            searches[i] = t.search(self.settings, lowest)
            return searches[i]

        def done(i: int, o: Judged) -> None:
            searches[i].record(o)
            walls[i] += o.wall
            if on_point:
                on_point(tasks[i].candidate.label, o)
            if prune:
                bound = best_lo() / factor
                for s in searches:
                    if s is not None:
                        s.prune(bound)

        self._run_rounds(tasks, probes, searches, begin, done)
        return [
            CandidateResult(t.candidate, list(s.points.values()), w, s.futile)
            for t, s, w in zip(tasks, searches, walls, strict=True)
        ]

    def _run_rounds(self, tasks, probes: list[Probe], searches, begin, done) -> None:
        """Rounds of probes, at most one per candidate, simulated together and recorded in
        candidate order; a round holds at least ``jobs`` points (a probe has one per seed), a
        multiple of ``jobs`` when the probes allow, so that no worker idles."""
        waiting: list[int] = []  # started, between points
        pending = list(range(len(tasks)))  # not started yet

        def next_point() -> tuple[int, float] | None:
            while waiting:
                i = waiting.pop(0)
                r = searches[i].propose()
                if r is not None:
                    return i, r
            while pending:
                i = pending.pop(0)
                r = begin(i).propose()
                if r is not None:
                    return i, r
            return None

        while True:
            batch: list[tuple[int, float]] = []
            specs: list[list] = []
            n = 0  # points in the round: at least ``jobs``, a multiple of it when possible
            while (n < self.jobs or n % self.jobs) and (nxt := next_point()) is not None:
                i, r = nxt
                batch.append(nxt)
                specs.append(
                    [(tasks[i].candidate, s) for s in probes[i].specs(tasks[i].candidate, r)]
                )
                n += len(specs[-1])
            if not batch:
                return
            outs = iter(self.simulate([job for group in specs for job in group]))
            for (i, r), group in zip(batch, specs, strict=True):
                done(i, probes[i].combine(r, [next(outs) for _ in group]))
                waiting.append(i)
