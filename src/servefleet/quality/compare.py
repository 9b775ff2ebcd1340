"""Comparing two deployments' answers to the same prompts: pure, no I/O.

Both sides answer greedily (``temperature 0``) with the logprobs of their tokens and of the most
likely tokens at each place. Per prompt (``compare``):

* **exact match**: the two texts are equal;
* **first divergence**: the index of the first token where the candidate's differs from the
  reference's (None when every token is equal; the shorter answer's end counts as a difference);
* **differing tokens**: of the reference's tokens, how many the candidate does not have at the
  same index. A real model continues from its own text after a divergence, so read exact match
  and the first divergence first; a stand-in that alters tokens independently (the sim-server's
  ``--alter-tokens``) differs at exactly the share it alters;
* **logprob differences** of the reference's tokens up to and including the first divergence
  (where both sides saw the same text): the candidate's logprob of the reference's token minus
  the reference's own, from the candidate's token or its top logprobs (missing when the
  reference's token is not among them).

Over all prompts (``summarize``): the exact-match rate, the share of differing tokens, the first
divergences, the distribution of |logprob difference|, and with expected answers the accuracy of
each side (Wilson 95 % interval) and the candidate's minus the reference's (paired, normal 95 %
interval on the per-prompt differences).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

Z95 = 1.959963984540054
"""The standard normal's 97.5th percentile: two-sided 95 % intervals."""


@dataclass(slots=True)
class Answer:
    """One side's answer to one prompt."""

    text: str = ""
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """The logprob of each token of ``tokens``."""
    top: list[dict[str, float]] = field(default_factory=list)
    """At each index, the most likely tokens with their logprobs."""
    error: str | None = None


@dataclass(slots=True)
class PromptComparison:
    index: int
    prompt: str
    exact: bool
    first_divergence: int | None
    compared: int
    """Tokens of the reference's answer."""
    differing: int
    """Of them, those the candidate does not have at the same index."""
    logprob_deltas: list[float]
    missing_logprobs: int
    reference: str
    candidate: str
    expected: str | None = None
    correct: tuple[bool, bool] | None = None
    """(reference, candidate) answered ``expected`` (``is_correct``)."""
    error: str | None = None


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def is_correct(output: str, expected: str) -> bool:
    """The expected answer appears in the output, ignoring case and runs of whitespace."""
    return normalize(expected) in normalize(output)


def compare(
    index: int, prompt: str, ref: Answer, cand: Answer, expected: str | None = None
) -> PromptComparison:
    error = ref.error or cand.error
    if error is not None:
        return PromptComparison(
            index, prompt, False, None, 0, 0, [], 0, ref.text, cand.text, expected, None, error
        )
    a, b = ref.tokens, cand.tokens
    first = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    differing = sum(1 for k, t in enumerate(a) if k >= len(b) or b[k] != t)
    deltas, missing = [], 0
    last = len(a) - 1 if first is None else min(first, len(a) - 1)
    for k in range(last + 1):
        if k < len(b) and b[k] == a[k]:
            deltas.append(cand.logprobs[k] - ref.logprobs[k])
        elif k < len(cand.top) and a[k] in cand.top[k]:
            deltas.append(cand.top[k][a[k]] - ref.logprobs[k])
        else:
            missing += 1
    correct = None
    if expected is not None:
        correct = (is_correct(ref.text, expected), is_correct(cand.text, expected))
    exact = ref.text == cand.text
    return PromptComparison(
        index, prompt, exact, first, len(a), differing, deltas, missing, ref.text, cand.text,
        expected, correct,
    )  # fmt: skip


@dataclass(slots=True)
class Interval:
    value: float
    low: float
    high: float


def wilson(successes: int, n: int) -> Interval:
    """A proportion with its Wilson score 95 % interval."""
    p = successes / n
    den = 1 + Z95**2 / n
    mid = (p + Z95**2 / (2 * n)) / den
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / den
    return Interval(p, max(0.0, mid - half), min(1.0, mid + half))


def paired_difference(pairs: list[tuple[bool, bool]]) -> Interval:
    """Mean of (candidate − reference) over prompts, with a normal 95 % interval."""
    d = np.array([int(b) - int(a) for a, b in pairs], dtype=float)
    mean = float(d.mean())
    half = Z95 * float(d.std(ddof=1)) / math.sqrt(len(d)) if len(d) > 1 else math.inf
    return Interval(mean, mean - half, mean + half)


@dataclass(slots=True)
class QualitySummary:
    prompts: int
    errors: int
    exact_match_rate: float | None
    differing_token_share: float | None
    diverged: int
    first_divergence_p50: float | None
    logprob_deltas: int
    missing_logprobs: int
    abs_logprob_delta: dict[str, float | None]
    """|candidate − reference| logprob of the reference's tokens: mean, p50, p90, p99, max."""
    accuracy: dict[str, dict[str, float]] | None
    """With expected answers: reference, candidate (Wilson) and difference (paired)."""

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(rows: list[PromptComparison]) -> QualitySummary:
    ok = [r for r in rows if r.error is None]
    compared = sum(r.compared for r in ok)
    firsts = [r.first_divergence for r in ok if r.first_divergence is not None]
    deltas = np.abs(np.array([d for r in ok for d in r.logprob_deltas], dtype=float))

    def pct(q: float) -> float | None:
        return float(np.percentile(deltas, q)) if deltas.size else None

    accuracy = None
    graded = [r.correct for r in ok if r.correct is not None]
    if graded:
        ref = wilson(sum(a for a, _ in graded), len(graded))
        cand = wilson(sum(b for _, b in graded), len(graded))
        accuracy = {
            "reference": asdict(ref),
            "candidate": asdict(cand),
            "difference": asdict(paired_difference(graded)),
            "graded": len(graded),  # type: ignore[dict-item]
        }
    return QualitySummary(
        prompts=len(rows),
        errors=len(rows) - len(ok),
        exact_match_rate=sum(r.exact for r in ok) / len(ok) if ok else None,
        differing_token_share=sum(r.differing for r in ok) / compared if compared else None,
        diverged=len(firsts),
        first_divergence_p50=float(np.median(firsts)) if firsts else None,
        logprob_deltas=int(deltas.size),
        missing_logprobs=sum(r.missing_logprobs for r in ok),
        abs_logprob_delta={
            "mean": float(deltas.mean()) if deltas.size else None,
            "p50": pct(50),
            "p90": pct(90),
            "p99": pct(99),
            "max": float(deltas.max()) if deltas.size else None,
        },
        accuracy=accuracy,
    )
