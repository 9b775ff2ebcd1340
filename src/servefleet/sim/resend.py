"""What the server makes of an earlier answer that a client sends back as text.

A chat client resends a session's history as messages: the earlier answers as the *text* it
received. The server renders the chat template and tokenizes that text again. Its prefix cache
holds the token ids the model *generated*; the resent answer hits it only as far as the
re-tokenized text reproduces those ids, and it is as many tokens as the text re-tokenizes to::

    generated (cached):   g0 g1 g2 g3 g4 ... g(n-1)
    resent, re-tokenized: g0 g1 x2 x3 x4 x5 x6 ...        (first difference at position 2)
                          |reuse·n|  the rest: new tokens, ratio·n in all

Measured on real vLLM 0.26 (``benchmarks/real_vllm/session_probe.py``, 64 turns): with a trained
model the text of an answer normally re-tokenizes to the same ids (``EXACT``); with random
weights and the shared test tokenizer the model emits padding tokens (``" xtok95023"``) and
partial UTF-8 pieces whose text re-tokenizes to 5.50 tokens each, and no resent answer matched
its first generated token (``RANDOM_WEIGHTS``). The previous prompt, rendered by the same
template, is always a prefix of the next one and hits as far as its full blocks go.

Rule: a segment of kind ``answer`` of length ``n`` becomes two segments: the answer's own key for
``floor(reuse · n)`` tokens (the engine's generated tokens: cache hits), then a key of its own for
the rest of ``round(ratio · n)`` tokens. Pure; no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from servefleet.workload.types import RequestSpec, Segment

RETOKENIZED_SUFFIX = "~text"
"""Key suffix of the re-tokenized part of a resent answer (equal text, equal tokens)."""


@dataclass(frozen=True, slots=True)
class AnswerResend:
    reuse: float = 1.0
    """Fraction of an answer's generated tokens that the resent text reproduces, from its start."""
    ratio: float = 1.0
    """Tokens of the re-tokenized answer per generated token."""
    name: str = "exact"

    def __post_init__(self) -> None:
        if not 0.0 <= self.reuse <= 1.0:
            raise ValueError(f"answer reuse must be within [0, 1], got {self.reuse}")
        if not self.ratio >= self.reuse:
            raise ValueError(f"answer token ratio {self.ratio} is below its reuse {self.reuse}")

    @property
    def exact(self) -> bool:
        return self.reuse == 1.0 and self.ratio == 1.0

    def segments(self, seg: Segment) -> tuple[Segment, ...]:
        """What one resent answer segment is to the server."""
        reused = math.floor(self.reuse * seg.length)
        total = max(reused, round(self.ratio * seg.length))
        out = []
        if reused:
            out.append(Segment(seg.key, reused, "answer"))
        if total > reused:
            out.append(Segment(seg.key + RETOKENIZED_SUFFIX, total - reused, "answer"))
        return tuple(out)

    def apply(self, spec: RequestSpec) -> RequestSpec:
        """``spec`` as the server tokenizes it (the same object when nothing changes)."""
        if self.exact or not any(s.kind == "answer" for s in spec.prompt):
            return spec
        prompt: list[Segment] = []
        for seg in spec.prompt:
            prompt.extend(self.segments(seg) if seg.kind == "answer" else (seg,))
        return replace(spec, prompt=tuple(prompt))


EXACT = AnswerResend()
RANDOM_WEIGHTS = AnswerResend(reuse=0.0, ratio=5.5, name="random-weights")
"""vLLM 0.26 with ``--load-format dummy`` and the shared test tokenizer (session_probe.py)."""
PROFILES = {p.name: p for p in (EXACT, RANDOM_WEIGHTS)}


def parse_answer_resend(text: str) -> AnswerResend:
    """``exact``, ``random-weights`` or ``REUSE:RATIO`` (e.g. ``0.9:1.05``)."""
    key = text.strip().lower()
    if key in PROFILES:
        return PROFILES[key]
    reuse, sep, ratio = key.partition(":")
    try:
        if not sep:
            raise ValueError
        return AnswerResend(float(reuse), float(ratio), name=key)
    except ValueError as exc:
        detail = f": {exc}" if str(exc) else ""
        raise ValueError(
            f"resent answers {text!r}{detail}; use {', '.join(PROFILES)} or REUSE:RATIO "
            "(fraction of an answer's tokens the resent text reproduces, tokens per generated "
            "token), e.g. 0.9:1.0"
        ) from None
