"""The workload file, validated (pydantic lives here, at the edge, and nowhere else).

``WorkloadSpec`` is what a run records (``model_dump``); ``build()`` methods turn each part into
the small runtime objects of ``distributions``, ``arrivals`` and ``classes``. File paths are
resolved against ``context={"base_dir": ...}`` at validation and must exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    model_validator,
)

from . import arrivals as arr
from . import distributions as dist
from .classes import RequestClass, SessionShape, SystemPrompt
from .datasets import (
    MOONCAKE_BLOCK_TOKENS,
    TokenCounter,
    TraceFormat,
    TraceRecord,
    load_lengths,
    load_sharegpt,
    load_trace,
)

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$", max_length=64)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _resolve(path: str, info: ValidationInfo) -> str:
    base = Path((info.context or {}).get("base_dir") or ".")
    p = (base / Path(path).expanduser()).resolve()
    if not p.is_file():
        hint = (
            f" (relative paths are taken from {base.resolve()})"
            if not Path(path).is_absolute()
            else ""
        )
        raise ValueError(f"file not found: {p}{hint}")
    return str(p)


DataFile = Annotated[str, AfterValidator(_resolve)]


# ---- lengths ----------------------------------------------------------------------------------


class FixedLength(_Model):
    type: Literal["fixed"] = "fixed"
    value: PositiveInt

    def build(self) -> dist.Fixed:
        return dist.Fixed(self.value)


class UniformLength(_Model):
    type: Literal["uniform"] = "uniform"
    min: PositiveInt
    max: PositiveInt

    @model_validator(mode="after")
    def _order(self):
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self

    def build(self) -> dist.Uniform:
        return dist.Uniform(self.min, self.max)


class _Clipped(_Model):
    mean: PositiveFloat
    sd: NonNegativeFloat
    min: PositiveInt = 1
    max: PositiveInt | None = None

    @model_validator(mode="after")
    def _order(self):
        if self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class NormalLength(_Clipped):
    type: Literal["normal"] = "normal"

    def build(self) -> dist.Normal:
        return dist.Normal(self.mean, self.sd, self.min, self.max)


class LogNormalLength(_Clipped):
    type: Literal["lognormal"] = "lognormal"
    sd: PositiveFloat

    def build(self) -> dist.LogNormal:
        return dist.LogNormal(self.mean, self.sd, self.min, self.max)


class EmpiricalLength(_Model):
    type: Literal["empirical"] = "empirical"
    path: DataFile

    def build(self) -> dist.Empirical:
        return dist.Empirical(load_lengths(self.path), self.path)


def _int_is_fixed(v):
    return {"type": "fixed", "value": v} if isinstance(v, int) and not isinstance(v, bool) else v


LengthSpec = Annotated[
    FixedLength | UniformLength | NormalLength | LogNormalLength | EmpiricalLength,
    Field(discriminator="type"),
    BeforeValidator(_int_is_fixed),
]

# ---- arrivals ---------------------------------------------------------------------------------


class PoissonArrival(_Model):
    type: Literal["poisson"] = "poisson"
    rate: PositiveFloat

    def build(self) -> arr.Poisson:
        return arr.Poisson(self.rate)


class GammaArrival(_Model):
    type: Literal["gamma"] = "gamma"
    rate: PositiveFloat
    burstiness: PositiveFloat = 1.0

    def build(self) -> arr.Gamma:
        return arr.Gamma(self.rate, self.burstiness)


class ConstantArrival(_Model):
    type: Literal["constant"] = "constant"
    rate: PositiveFloat

    def build(self) -> arr.Constant:
        return arr.Constant(self.rate)


class BurstsArrival(_Model):
    type: Literal["bursts"] = "bursts"
    count: PositiveInt
    period: PositiveFloat

    def build(self) -> arr.Bursts:
        return arr.Bursts(self.count, self.period)


class ClosedArrival(_Model):
    type: Literal["closed"] = "closed"
    concurrency: PositiveInt

    def build(self) -> arr.Closed:
        return arr.Closed(self.concurrency)


class RampArrival(_Model):
    type: Literal["ramp"] = "ramp"
    start_rate: NonNegativeFloat
    end_rate: NonNegativeFloat
    duration: PositiveFloat
    poisson: bool = True

    @model_validator(mode="after")
    def _some_rate(self):
        if self.start_rate == 0 and self.end_rate == 0:
            raise ValueError("start_rate and end_rate are both 0; give at least one a rate > 0")
        return self

    def build(self) -> arr.Ramp:
        return arr.Ramp(self.start_rate, self.end_rate, self.duration, self.poisson)


ArrivalSpec = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | BurstsArrival | ClosedArrival | RampArrival,
    Field(discriminator="type"),
]

# ---- classes ----------------------------------------------------------------------------------


class SystemPromptSpec(_Model):
    tokens: PositiveInt
    share: float = Field(1.0, ge=0.0, le=1.0)
    groups: PositiveInt = 1
    name: Name | None = None
    """Pool name in the segment keys ``sys:<name>:<g>`` (default: the workload's name); classes
    that name the same pool share its prompts, so they must agree on ``tokens``."""


class SessionSpec(_Model):
    turns: LengthSpec
    think_time_mean: NonNegativeFloat = 0.0


class ShareGPTDataset(_Model):
    type: Literal["sharegpt"] = "sharegpt"
    path: DataFile


class ClassSLO(_Model):
    """A class's own service-level objectives (seconds); a field left out is the run's
    (``--slo-ttft`` / ``--slo-itl``)."""

    ttft: PositiveFloat | None = None
    itl: PositiveFloat | None = None
    """Applied to each request's TPOT, as ``--slo-itl``."""


class ClassSpec(_Model):
    weight: PositiveFloat = 1.0
    """Share of *requests* (every turn of a session counts) this class should have wherever a
    class is drawn: a closed loop, or an arrival process shared by several classes."""
    prompt: LengthSpec | None = None
    """Prompt tokens of a request (for a session: the new user message of each turn)."""
    output: LengthSpec | None = None
    dataset: ShareGPTDataset | None = None
    """(prompt, output) length pairs from a dataset, instead of ``prompt`` and ``output``."""
    arrival: ArrivalSpec | None = None
    system_prompt: SystemPromptSpec | None = None
    session: SessionSpec | None = None
    slo: ClassSLO | None = None
    """SLOs of this class when they differ from the run's (reports, goodput, per-class
    verdicts)."""

    @model_validator(mode="after")
    def _lengths(self):
        if self.dataset is not None and (self.prompt or self.output):
            raise ValueError("give either `dataset` or `prompt` and `output`, not both")
        if self.dataset is None and (self.prompt is None or self.output is None):
            missing = [k for k in ("prompt", "output") if getattr(self, k) is None]
            raise ValueError(
                f"missing {' and '.join(missing)}: add e.g. `prompt: 512` and `output: 128`, or a `dataset:`"
            )
        return self

    def build(self, name: str, pool: str, count_tokens: TokenCounter) -> RequestClass:
        if self.dataset is not None:
            lengths = dist.PairedLengths(*load_sharegpt(self.dataset.path, count_tokens))
        else:
            lengths = dist.IndependentLengths(self.prompt.build(), self.output.build())
        sp = self.system_prompt
        system = SystemPrompt(sp.tokens, sp.share, sp.groups, sp.name or pool) if sp else None
        s = self.session
        session = SessionShape(s.turns.build(), s.think_time_mean) if s else None
        return RequestClass(name, self.weight, lengths, system, session)


# ---- the workload -----------------------------------------------------------------------------


class TraceSpec(_Model):
    path: DataFile
    format: TraceFormat = "auto"
    """servefleet | mooncake | azure | records (auto: from the file, ``datasets.load_trace``)."""
    time_scale: PositiveFloat = 1.0
    """Multiplies the gaps of the trace: 0.5 replays twice as fast."""
    max_requests: PositiveInt | None = None
    """Replay only the first this many records (in time order)."""
    block_size: PositiveInt = MOONCAKE_BLOCK_TOKENS
    """Tokens per ``hash_ids`` block of a Mooncake trace."""

    def records(self) -> list[TraceRecord]:
        """The records this replay sends, in time order."""
        records = load_trace(self.path, self.format, self.block_size)
        return records[: self.max_requests] if self.max_requests else records


class WorkloadSpec(_Model):
    name: Name = "workload"
    description: str = ""
    base: str | None = None
    """The preset this workload was built on (already merged in; kept as a record)."""
    arrival: ArrivalSpec | None = None
    """The default arrival process, for every class that has none of its own."""
    classes: dict[Name, ClassSpec] = Field(default_factory=dict)
    trace: TraceSpec | None = None
    """Replay a trace instead of synthetic classes."""
    users: PositiveInt | None = None
    """Size of the user population ids are drawn from (default: one user per unit of work)."""

    @model_validator(mode="after")
    def _consistent(self):
        if (self.trace is None) == (not self.classes):
            raise ValueError(
                "give either `classes:` (synthetic traffic) or `trace:` (a replay), exactly one"
            )
        orphans = [n for n, c in self.classes.items() if c.arrival is None]
        if orphans and self.arrival is None:
            raise ValueError(
                f"classes {orphans} have no `arrival:` and the workload has no default; add "
                "e.g. `arrival: {type: poisson, rate: 10}` at the top level or in each class"
            )
        _check_pools(self)
        return self


def _check_pools(spec: WorkloadSpec) -> None:
    seen: dict[str, tuple[str, int]] = {}
    for name, c in spec.classes.items():
        if c.system_prompt is None:
            continue
        pool = c.system_prompt.name or spec.name
        other = seen.setdefault(pool, (name, c.system_prompt.tokens))
        if other[1] != c.system_prompt.tokens:
            raise ValueError(
                f"classes {other[0]!r} and {name!r} share system prompt pool {pool!r} with "
                f"different tokens ({other[1]} vs {c.system_prompt.tokens}); give one a "
                "distinct `system_prompt.name`"
            )
