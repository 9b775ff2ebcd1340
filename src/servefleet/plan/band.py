"""Uncertainty, stated: how far the plan's rate moves when the engine model's unmeasured
figures move within their plausible range, and whether the ranking of two topologies can flip.

Inputs: ``hardware.parameter_bands(gpu)`` — for every figure of the GPU that is not measured on
it (efficiencies carried over from the H200, tensor-parallel collective costs on every GPU), a
``Band(low, high, basis, source)``; ``hardware.with_parameters`` gives the GPU at other values.

Rule:

1. **Direction and sensitivity (cost model, no simulation).** For each banded parameter, the
   cost model's capacity estimate (``search.estimate_rate``) of each topology at the band's low
   and high ends, the rest nominal: which end is optimistic for that topology, and how much it
   moves the estimate and the ratio of the two topologies.
2. **Corners (simulated).** Every parameter at its optimistic end for the chosen topology
   (``optimistic``), at its pessimistic end (``pessimistic``), and the two corners that favour
   one topology over the other most (each parameter at the end that maximises, or minimises,
   the ratio of the two estimates). Each topology's rate search is screened at every corner
   (``ShortProbe``, the same windows and seed as the nominal screening, starting at the nominal
   screened rate × the corner's estimate ratio).
3. **The band** of a topology's sustainable rate = its verified (or long-run) rate × the
   corner's screened rate ÷ its nominal screened rate: long runs give the level, the corners
   its spread. Resolution: the search's ``rel_tol``.
   Every corner is reported: one where no rate tried held counts as 0 ("no rate holds").
4. **Flip.** The runner-up-to-chosen rate ratio at nominal, scaled at each corner. "The ranking
   holds" is said only when the two bands do not overlap (and the ratio stays on one side of
   1); otherwise the plan prints the one measurement that settles it: ``servefleet bench`` of
   one replica of each on one node.
5. **The recommended rate** (``PessimisticCheck``): the chosen topology simulated again on long
   runs at the band's lowest corner (its GPU figures), from the band's estimate there down,
   until a rate holds: that rate is recommended, the nominal one shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from servefleet.hardware import Band, GPUSpec, parameter_bands, parameter_value, with_parameters
from servefleet.sim.deployment import Deployment

from .profile import WorkloadProfile
from .search import CandidateResult, Task, estimate_rate

MAX_STEPS_DOWN = 6
"""A corner's search starts at its estimate and steps by 1 + rel_tol: at most this many down."""
CORNERS = ("optimistic", "pessimistic", "favours chosen", "favours runner-up")


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """One parameter: its band, and the cost model's capacity estimate of each topology at the
    band's ends relative to nominal (``(at low, at high)``)."""

    name: str
    band: Band
    nominal: float
    chosen: tuple[float, float]
    runner_up: tuple[float, float] | None

    def to_dict(self) -> dict:
        return {
            "parameter": self.name,
            "nominal": self.nominal,
            "low": self.band.low,
            "high": self.band.high,
            "basis": self.band.basis,
            "source": self.band.source,
            "chosen_estimate_at_low_high": list(self.chosen),
            "runner_up_estimate_at_low_high": None
            if self.runner_up is None
            else list(self.runner_up),
        }


@dataclass(slots=True)
class TopologyBand:
    label: str
    level: float
    """Its sustainable rate (verified, or from the long search)."""
    nominal_screened: float
    corners: dict[str, CandidateResult] = field(default_factory=dict)

    def scaled(self, corner: str) -> float | None:
        """The sustainable rate at ``corner``: level × corner's screened ÷ nominal screened;
        0.0 where no rate tried at that corner held (None: the corner was not searched)."""
        r = self.corners.get(corner)
        if r is None or not self.nominal_screened:
            return None
        if r.best is None:
            return 0.0
        return self.level * r.max_rate / self.nominal_screened

    def worst_corner(self) -> tuple[str, float] | None:
        """(corner, its scaled rate) of the lowest corner: the pessimistic end of the band."""
        vals = [(c, v) for c in CORNERS if (v := self.scaled(c)) is not None]
        return min(vals, key=lambda cv: cv[1]) if vals else None

    def range(self) -> tuple[float, float] | None:
        """(lowest, highest) sustainable rate over the corners and nominal: every corner,
        a corner where no rate holds as 0."""
        vals = [v for c in CORNERS if (v := self.scaled(c)) is not None]
        vals.append(self.level)
        return (min(vals), max(vals)) if vals else None

    def to_dict(self) -> dict:
        return {
            "topology": self.label,
            "sustainable_rate": self.level,
            "nominal_screened_rate": self.nominal_screened,
            "corners": {
                c: {
                    "screened_rate": r.max_rate if r.best else None,
                    "rates_simulated": sorted(p.rate for p in r.points),
                    "sustainable_rate_scaled": self.scaled(c),
                    "no_rate_holds": r.best is None,
                }
                for c, r in self.corners.items()
            },
        }


@dataclass(slots=True)
class PessimisticCheck:
    """The chosen topology re-checked at the pessimistic end of its band: the band's lowest
    corner, its GPU figures, simulated on long runs at a fresh seed from the band's estimate
    down (steps of ``sustainable.VERIFY_STEP``) until a rate holds. Its rate is the one the plan
    recommends."""

    corner: str
    values: dict[str, float]
    estimate: float
    """The band's scaled rate at this corner (0: no rate held in its screening)."""
    result: CandidateResult | None = None
    """The long runs (None: not run, as when no rate held in screening)."""
    simulate_command: str = ""
    """The `servefleet simulate` line of the rate that held (or of the last one tried)."""

    @property
    def held(self):
        """The highest rate that held (a ``Sustained``), or None."""
        return None if self.result is None else self.result.best

    @property
    def rate(self) -> float | None:
        return None if self.held is None else self.held.rate

    @property
    def shown(self):
        """The point the simulate line reproduces: the rate that held, else the lowest tried."""
        if self.result is None or not self.result.points:
            return None
        return self.held or min(self.result.points, key=lambda p: p.rate)

    def to_dict(self) -> dict:
        return {
            "corner": self.corner,
            "parameters": self.values,
            "estimate": self.estimate,
            "rate": self.rate,
            "no_rate_holds": self.rate is None,
            "rates_simulated": sorted(p.rate for p in self.result.points) if self.result else [],
            "simulate_command": self.simulate_command,
        }


@dataclass(slots=True)
class UncertaintyBand:
    gpu: str
    parameters: list[Sensitivity]
    corners: dict[str, dict[str, float]]
    """Corner -> parameter values."""
    chosen: TopologyBand
    runner_up: TopologyBand | None
    pessimistic: PessimisticCheck | None = None
    """The recommended rate: the chosen re-checked at its band's lowest corner."""

    @property
    def topologies(self) -> list[TopologyBand]:
        return [self.chosen] + ([self.runner_up] if self.runner_up else [])

    @property
    def measured(self) -> bool:
        """Every banded figure is measured on this GPU: nothing to spread."""
        return not self.parameters

    def ratio(self, corner: str | None = None) -> float | None:
        """Runner-up ÷ chosen sustainable rate, at nominal (None) or at ``corner``."""
        if self.runner_up is None:
            return None
        if corner is None:
            return self.runner_up.level / self.chosen.level
        a, b = self.runner_up.scaled(corner), self.chosen.scaled(corner)
        return None if a is None or not b else a / b

    def ratio_range(self) -> tuple[float, float] | None:
        vals = [v for c in (None, *CORNERS) if (v := self.ratio(c)) is not None]
        return (min(vals), max(vals)) if vals else None

    @property
    def overlap(self) -> bool:
        """The two topologies' bands share some rate: which one sustains more is not settled."""
        if self.runner_up is None:
            return False
        a, b = self.chosen.range(), self.runner_up.range()
        return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]

    @property
    def can_flip(self) -> bool:
        """The ranking is claimed only when the bands do not overlap (and the ratio stays on
        one side of 1 at every corner)."""
        rr = self.ratio_range()
        return self.overlap or (rr is not None and rr[0] <= 1.0 <= rr[1])

    def to_dict(self) -> dict:
        rr = self.ratio_range()
        return {
            "gpu": self.gpu,
            "parameters": [p.to_dict() for p in self.parameters],
            "corners": self.corners,
            "chosen": self.chosen.to_dict(),
            "runner_up": None if self.runner_up is None else self.runner_up.to_dict(),
            "ratio_runner_up_to_chosen": None
            if rr is None
            else {"nominal": self.ratio(), "min": rr[0], "max": rr[1]},
            "bands_overlap": self.overlap,
            "ranking_can_flip": self.can_flip,
            "pessimistic": None if self.pessimistic is None else self.pessimistic.to_dict(),
        }


def rests_on(dep: Deployment) -> str:
    """What a prediction for ``dep`` rests on, in words: the basis of its GPU's figures."""
    bands = parameter_bands(dep.gpu)
    eff = [n for n in bands if n.startswith("efficiency.")]
    link = [n for n in bands if n.startswith("interconnect.")]
    what = "measured on it"
    if eff:
        b = bands[eff[0]]
        what = b.source if b.source.startswith(b.basis) else f"{b.basis} ({b.source})"
    parts = [f"{dep.gpu.name}'s kernel efficiencies and step overheads: {what}"]
    if dep.tp > 1:
        parts.append(
            f"tensor-parallel collectives over {dep.gpu.interconnect.description}: "
            + (bands[link[0]].basis if link else "measured")
        )
    else:
        parts.append("no collectives (TP=1)")
    return "; ".join(parts)


def _matters(dep: Deployment, values: dict[str, float]) -> bool:
    """Whether moving ``values`` can change ``dep``'s simulation: a replica of one GPU has no
    collectives, so the interconnect's figures do not enter its cost model."""
    return dep.tp > 1 or any(not n.startswith("interconnect.") for n in values)


def deployment_at(dep: Deployment, values: dict[str, float]) -> Deployment:
    """``dep`` with its GPU's banded figures at ``values`` (a corner)."""
    return dep.with_(gpu=with_parameters(dep.gpu, values)) if values else dep


_at = deployment_at


def _relative(dep: Deployment, base: float, name: str, ends, profile) -> tuple[float, float]:
    """The capacity estimate with ``name`` at each of ``ends``, ÷ the nominal estimate."""
    low, high = (estimate_rate(_at(dep, {name: v}), profile) / base for v in ends)
    return low, high


def sensitivities(
    gpu: GPUSpec, chosen: Deployment, runner: Deployment | None, profile
) -> list[Sensitivity]:
    bands = parameter_bands(gpu)
    base_c = estimate_rate(chosen, profile)
    base_r = estimate_rate(runner, profile) if runner is not None else None
    out = []
    for name, band in bands.items():
        ends = (band.low, band.high)
        out.append(
            Sensitivity(
                name,
                band,
                parameter_value(gpu, name),
                _relative(chosen, base_c, name, ends, profile),
                _relative(runner, base_r, name, ends, profile) if runner and base_r else None,
            )
        )
    return out


def corner_values(params: list[Sensitivity]) -> dict[str, dict[str, float]]:
    """The four corners: each parameter at one end of its band (``CORNERS``)."""
    out: dict[str, dict[str, float]] = {c: {} for c in CORNERS}
    for p in params:
        lo, hi = p.band.low, p.band.high
        c_lo, c_hi = p.chosen
        out["optimistic"][p.name] = hi if c_hi >= c_lo else lo
        out["pessimistic"][p.name] = lo if c_hi >= c_lo else hi
        if p.runner_up is not None:
            q_lo, q_hi = p.runner_up[0] / c_lo, p.runner_up[1] / c_hi
            out["favours runner-up"][p.name] = hi if q_hi >= q_lo else lo
            out["favours chosen"][p.name] = lo if q_hi >= q_lo else hi
    if not any(p.runner_up is not None for p in params):
        del out["favours chosen"], out["favours runner-up"]
    return out


@dataclass(slots=True)
class BandRun:
    """The corner searches to run (``tasks``, with what each is for) and the band they fill."""

    band: UncertaintyBand
    tasks: list[Task]
    keys: list[tuple[TopologyBand, str]]

    def fill(self, results: list[CandidateResult]) -> UncertaintyBand:
        for (tb, corner), r in zip(self.keys, results, strict=True):
            tb.corners[corner] = r
        return self.band


def band_run(
    profile: WorkloadProfile,
    rel_tol: float,
    chosen: tuple[CandidateResult, float],
    runner_up: tuple[CandidateResult, float] | None,
) -> BandRun:
    """``chosen`` and ``runner_up``: (their nominal screening result, their sustainable rate).
    The corner searches start at the nominal screened rate × the corner's estimate ratio."""
    c_res, c_level = chosen
    c_dep = c_res.candidate.deployment
    r_dep = runner_up[0].candidate.deployment if runner_up else None
    params = sensitivities(c_dep.gpu, c_dep, r_dep, profile)
    corners = corner_values(params) if params else {}
    pairs = [(c_res, TopologyBand(c_res.candidate.label, c_level, c_res.max_rate))]
    if runner_up is not None:
        r_res, r_level = runner_up
        pairs.append((r_res, TopologyBand(r_res.candidate.label, r_level, r_res.max_rate)))
    band = UncertaintyBand(
        c_dep.gpu.name, params, corners, pairs[0][1], pairs[1][1] if runner_up else None
    )
    tasks, keys = [], []
    for corner, values in corners.items():
        for res, tb in pairs:
            c = res.candidate
            if not _matters(c.deployment, values):
                tb.corners[corner] = res  # the same simulation: the nominal screening holds
                continue
            dep = _at(c.deployment, values)
            est = estimate_rate(dep, profile) / estimate_rate(c.deployment, profile)
            cand = replace(c, variant=f"{corner} corner", deployment=dep)
            tasks.append(Task(cand, res.max_rate * est, 1 + rel_tol, max_down=MAX_STEPS_DOWN))
            keys.append((tb, corner))
    return BandRun(band, tasks, keys)
