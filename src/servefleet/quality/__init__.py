"""Did the deployment change the answers? A pure comparison of two deployments' greedy answers
to the same prompts (``compare``), and what they are asked (``prompts``). The HTTP client that
asks them is ``servefleet.bench.quality``; the HTML section ``servefleet.report.quality``;
the command ``servefleet quality`` (docs/quality.md)."""

from __future__ import annotations

from .compare import (
    Answer,
    Interval,
    PromptComparison,
    QualitySummary,
    compare,
    is_correct,
    paired_difference,
    summarize,
    wilson,
)
from .prompts import BUILT_IN, Prompt, PromptFileError, load_prompts

__all__ = [
    "BUILT_IN",
    "Answer",
    "Interval",
    "Prompt",
    "PromptComparison",
    "PromptFileError",
    "QualitySummary",
    "compare",
    "is_correct",
    "load_prompts",
    "paired_difference",
    "summarize",
    "wilson",
]
