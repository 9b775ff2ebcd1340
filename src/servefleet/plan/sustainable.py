"""From screened candidates to a rate that holds in production: the sustainability stage.

Rule:

1. **Finalists.** The screened choice (the best topology, or the flag variant that beat it)
   and the best two other topologies: the screening's one-minute windows rank close
   topologies no better than their resolution.
2. **Long search.** Each finalist's rate search is repeated with ``LongProbe``: long windows,
   the ``long_seeds``, ``sustain``'s criterion (SLO over the window and its last third,
   finished ≥ 97 % of offered, no rising queue). It starts at the screened rate and steps down
   by ``1 + rel_tol`` (a one-minute window is biased high, never low, near saturation); the
   runner-up starts at the first finalist's sustainable rate ÷ (1 + rel_tol), the least it
   needs to tie, and is dropped if it misses there (with two workers, the first two finalists
   start together, unseeded). The finalist that sustains the highest rate on the long runs
   wins, whatever the screening said; between equal rates, the one with more latency headroom
   there (``planner.pick_sustained``).
3. **Verification.** The winner's sustainable rate is simulated again on fresh seeds
   (``verify_seeds``) over ``verify_window`` seconds. If a seed misses, the rate steps down by
   ``VERIFY_STEP`` and is checked again (at most ``verify_steps`` times). Only a verified rate
   is printed.
4. **Headroom.** The lowest rate seen failing above the verified one (long search or
   verification): where the SLO first breaks. The plan recommends operating at or below the
   verified rate, and says how far below the break it is.
5. **Fallback.** When no step of the verification holds, the next finalist (in screening order)
   is taken: its long-search result if it held, else a long search of its own (the runner-ups'
   searches stop as soon as they cannot win, so they may hold no rate yet), then verified.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .band import PessimisticCheck, UncertaintyBand, deployment_at
from .probes import LongProbe, Sustained, long_timing, seeds
from .profile import WorkloadProfile
from .runner import Runner
from .search import CandidateResult, SLOTarget, Task

VERIFY_STEP = 1.05
MAX_STEPS_DOWN = 8
"""A long search steps down by 1 + rel_tol at most this often (1.1^8: to 47 % of the screened
rate); each step is a long run."""
COARSE_STEPS_DOWN = 4
"""... then by ``search.COARSE_STEP`` (1.5) at most this often (to 9 % of the screened rate):
a screened rate can be far above what holds for long (a burst that one short window happened
to catch lightly), and "no rate holds" must mean that no rate near the bottom holds either."""


@dataclass(slots=True)
class Sustainability:
    results: list[CandidateResult]
    """The finalists' long searches (points are ``Sustained``), chosen first."""
    chosen: CandidateResult
    attempts: list[Sustained] = field(default_factory=list)
    """Verification at fresh seeds, in order; the last one is what the plan prints."""
    headroom: float | None = None
    reason: str = ""
    timing: tuple[float, float] = (0.0, 0.0)
    """The chosen's long points: (least measured seconds, warm-up)."""
    rejected: list[Sustainability] = field(default_factory=list)
    """Earlier choices that held on the search's seed but failed verification (step 5)."""

    @property
    def verified(self) -> Sustained:
        """The rate the plan prints: the one that held on the fresh seeds (or the last one
        tried, when none did)."""
        return self.attempts[-1]

    @property
    def ok(self) -> bool:
        return bool(self.attempts) and self.attempts[-1].ok

    @property
    def rate(self) -> float:
        return self.verified.rate

    def to_dict(self) -> dict:
        return {
            "chosen": self.chosen.candidate.label,
            "rate": self.rate,
            "verified": self.ok,
            "headroom_rate": self.headroom,
            "reason": self.reason,
            "verification": [a.to_dict() for a in self.attempts],
            "rejected": [r.to_dict() for r in self.rejected],
        }


FINALISTS = 3


def finalists(screened: list[CandidateResult], choice: CandidateResult) -> list[CandidateResult]:
    """The screened choice, then the best screened topologies of other TPs (``FINALISTS`` in
    all): a one-minute window ranks close topologies no better than its 10 % resolution."""
    tp = choice.candidate.deployment.tp
    others = [
        r
        for r in screened
        if r.best is not None
        and r.candidate.variant == "planner flags"
        and r.candidate.deployment.tp != tp
    ]
    others.sort(key=lambda r: (r.max_rate, r.candidate.deployment.replicas), reverse=True)
    return [choice, *others[: FINALISTS - 1]]


def long_search(
    runner: Runner,
    profile: WorkloadProfile,
    slo: SLOTarget,
    finals: list[CandidateResult],
    pick: Callable[[list[CandidateResult]], tuple[CandidateResult, str]],
    on_point=None,
) -> Sustainability:
    """Steps 1-2: the finalists' long searches and the pick (verification still to run)."""
    s = runner.settings
    timing = {r.candidate.label: long_timing(s, r) for r in finals}
    probe = LongProbe(profile, s, slo, timing, seeds(s.seed, s.long_seeds))
    factor = 1 + s.rel_tol
    tasks = [
        Task(
            r.candidate, r.max_rate, factor, max_down=MAX_STEPS_DOWN, coarse_down=COARSE_STEPS_DOWN
        )
        for r in finals
    ]
    results = runner.run(tasks, probe, prune=True, seed=True, on_point=on_point)
    held = [r for r in results if r.best is not None]
    if not held:
        return Sustainability(results, results[0], reason="no rate held on long runs")
    chosen, reason = pick(held)
    ordered = [chosen, *[r for r in results if r is not chosen]]
    return Sustainability(ordered, chosen, [], None, reason, timing[chosen.candidate.label])


def fallback(
    runner: Runner,
    profile: WorkloadProfile,
    slo: SLOTarget,
    finals: list[CandidateResult],
    searched: list[CandidateResult],
    tried: set[str],
    on_point=None,
) -> Sustainability | None:
    """Step 5: the next finalist to verify (None: none left). ``finals``: their screening;
    ``searched``: their long searches so far; ``tried``: the labels already verified."""
    for screen in finals:
        label = screen.candidate.label
        if label in tried:
            continue
        tried.add(label)
        done = next((r for r in searched if r.candidate.label == label), None)
        timing = long_timing(runner.settings, screen)
        if done is not None and done.best is not None:
            reason = f"{label} sustains {done.max_rate:g} req/s (the next finalist)"
            return Sustainability([done], done, [], None, reason, timing)
        sus = long_search(runner, profile, slo, [screen], lambda rs: (rs[0], ""), on_point)
        if sus.chosen.best is not None:
            sus.reason = f"{label} sustains {sus.chosen.max_rate:g} req/s (the next finalist)"
            return sus
    return None


def verification(
    sus: Sustainability, profile: WorkloadProfile, slo: SLOTarget, settings
) -> tuple[Task, LongProbe]:
    """Step 3 as a search: start at the chosen's sustainable rate, step down by
    ``VERIFY_STEP`` while a fresh seed misses (at most ``verify_steps``), never up."""
    s = settings
    label = sus.chosen.candidate.label
    window, warmup = sus.timing
    probe = LongProbe(
        profile,
        s,
        slo,
        {label: (max(s.verify_window, window), warmup)},
        seeds(s.seed, s.verify_seeds),
    )
    task = Task(sus.chosen.candidate, sus.chosen.max_rate, VERIFY_STEP, s.verify_steps, max_up=0)
    return task, probe


def verified(sus: Sustainability, result: CandidateResult) -> Sustainability:
    """Step 4: the verification's attempts (highest rate first) and the headroom."""
    sus.attempts = sorted(result.points, key=lambda p: -p.rate)
    ok = [a for a in sus.attempts if a.ok]
    if ok:  # the attempts stop at the first rate that holds
        sus.attempts = [a for a in sus.attempts if a.rate >= ok[0].rate]
    failing = [p.rate for p in sus.chosen.points if not p.ok]
    failing += [a.rate for a in sus.attempts if not a.ok]
    above = [r for r in failing if r > sus.rate]
    sus.headroom = min(above) if above else None
    return sus


def pessimistic_check(
    runner: Runner,
    sus: Sustainability,
    band: UncertaintyBand,
    profile: WorkloadProfile,
    slo: SLOTarget,
    on_point=None,
) -> PessimisticCheck | None:
    """Step 6 (``band.PessimisticCheck``): the verified choice at its band's lowest corner, on
    long runs at the first fresh seed, from the band's estimate there (at most the verified
    rate) down by ``VERIFY_STEP`` (then coarser) until a rate holds. None without a band."""
    worst = band.chosen.worst_corner()
    if worst is None:
        return None
    corner, estimate = worst
    check = PessimisticCheck(corner, dict(band.corners.get(corner, {})), estimate)
    if estimate <= 0 or not sus.ok:
        return check
    s = runner.settings
    cand = sus.chosen.candidate
    cand = replace(
        cand, variant=f"{corner} corner", deployment=deployment_at(cand.deployment, check.values)
    )
    window, warmup = sus.timing
    probe = LongProbe(
        profile,
        s,
        slo,
        {cand.label: (max(s.verify_window, window), warmup)},
        seeds(s.seed, s.verify_seeds[:1]),
    )
    task = Task(
        cand,
        min(estimate, sus.rate),
        VERIFY_STEP,
        max_down=s.verify_steps,
        max_up=0,
        coarse_down=COARSE_STEPS_DOWN,
    )
    check.result = runner.run([task], probe, on_point=on_point)[0]
    return check
