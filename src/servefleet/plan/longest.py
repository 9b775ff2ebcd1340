"""The longest request a workload can send: what ``--max-model-len`` must admit.

Rule: per class, the largest prompt + output its lengths allow — a fixed length, the top of a
uniform or of a clipped normal/log-normal (``max``), the largest observed value of empirical
lengths or of a dataset's pairs — plus its system prompt; a session's last turn resends every
earlier prompt and answer, so a class of up to T turns can send ``system + T × (prompt +
output)``. A trace's longest request is its longest record. A length with no upper bound (a
normal or log-normal without ``max``) has no declared longest: the longest of the sampled
requests stands in, and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.workload import WorkloadSpec
from servefleet.workload import distributions as dist
from servefleet.workload.classes import RequestClass
from servefleet.workload.source import build_groups

from .profile import WorkloadProfile


@dataclass(frozen=True, slots=True)
class Longest:
    tokens: int
    """The longest prompt + output (declared, or sampled where the workload sets no bound)."""
    declared: bool
    """False: some class has no upper bound, ``tokens`` is the longest sampled request."""
    how: str
    """Where it comes from, in words."""


def length_max(d) -> int | None:
    """The largest length a distribution can draw (None: unbounded)."""
    if isinstance(d, dist.Fixed):
        return d.value
    if isinstance(d, dist.Uniform):
        return d.high
    if isinstance(d, dist.Normal | dist.LogNormal):
        return d.high
    if isinstance(d, dist.Empirical):
        return int(d.values.max())
    return None


def class_longest(rc: RequestClass) -> tuple[int | None, str]:
    """(longest prompt + output of one request of ``rc``, how)."""
    lengths = rc.lengths
    if isinstance(lengths, dist.PairedLengths):
        pair = int((lengths.prompts + lengths.outputs).max())
        what = f"its longest (prompt, output) pair, {pair:,}"
    else:
        p, o = length_max(lengths.prompt), length_max(lengths.output)
        if p is None or o is None:
            return None, "no upper bound on its lengths"
        pair = p + o
        what = f"prompt <= {p:,} + output <= {o:,}"
    system = rc.system_prompt.tokens if rc.system_prompt else 0
    turns = length_max(rc.session.turns) if rc.session else 1
    if turns is None:
        return None, "no upper bound on its turns"
    total = system + turns * pair
    how = what
    if turns > 1:
        how = f"{turns} turns × ({what}), each turn resending the history"
    if system:
        how += f" + a {system:,}-token system prompt"
    return total, how


def declared_longest(spec: WorkloadSpec, profile: WorkloadProfile) -> Longest:
    sampled = profile.total_percentile(100)
    if spec.trace is not None:
        return Longest(
            sampled, True, f"the longest of the trace's {profile.num_requests:,} records"
        )
    best: tuple[int, str, str] | None = None
    unbounded: list[str] = []
    for group in build_groups(spec):
        for rc in group.classes:
            n, how = class_longest(rc)
            if n is None:
                unbounded.append(rc.name)
            elif best is None or n > best[0]:
                best = (n, rc.name, how)
    if unbounded:
        n = max(sampled, best[0] if best else 0)
        return Longest(
            n,
            False,
            f"classes {', '.join(sorted(set(unbounded)))} declare no longest request; the longest "
            f"of {profile.num_requests:,} sampled requests is {sampled:,}",
        )
    assert best is not None
    return Longest(best[0], True, f"class {best[1]}: {best[2]}")
