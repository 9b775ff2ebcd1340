"""Prompts as text: a workload's segments rendered into synthetic words.

* A segment's text is drawn from a generator seeded by its key, so equal keys give
  byte-identical text (prefix-cache hits happen as the workload intends).
* ``answer`` segments are replaced by the text actually received for that earlier request.
* Lengths: ``words_for(tokens)`` uses a tokens-per-word ratio measured with the server's
  ``POST /tokenize`` when it has one, else a local tokenizer when given, else calibrated from
  ``usage.prompt_tokens`` of two probe requests (see ``calibrate``). With a one-token-per-word
  tokenizer (the sim-server's) prompt lengths are exact; the records keep the target
  (``target_prompt_tokens``) and the server's count (``prompt_tokens``) side by side.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from servefleet.workload import RequestSpec, Segment

_C, _V = "bdfgklmnprstvz", "aeiou"
VOCAB: tuple[str, ...] = tuple(a + b + c + d for a in _C for b in _V for c in _C for d in _V)[:4096]


@dataclass(slots=True)
class Message:
    role: str
    content: str


class PromptRenderer:
    """Segments → text, with a bounded cache of rendered segments and the answers received."""

    def __init__(self, tokens_per_word: float = 1.0, cache_size: int = 4096, namespace: str = ""):
        if not tokens_per_word > 0:
            raise ValueError(f"tokens_per_word must be > 0, got {tokens_per_word}")
        self.tokens_per_word = tokens_per_word
        self.namespace = namespace
        """Salt of every segment's text: renderers of different namespaces share no text, so
        one benchmark point cannot hit the prefix cache that an earlier point filled."""
        _word_stream()  # built now, not while a point is being timed
        self._cache: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._cache_size = cache_size
        self.answers: dict[str, str] = {}
        """Output text received, by segment key (``output_key(request_id)``)."""

    def words_for(self, tokens: int) -> int:
        return max(1, round(tokens / self.tokens_per_word)) if tokens > 0 else 0

    def segment_text(self, seg: Segment) -> str:
        if seg.kind == "answer":
            got = self.answers.get(seg.key)
            if got is not None:
                return got
        key = (seg.key, seg.length)
        text = self._cache.get(key)
        if text is not None:
            self._cache.move_to_end(key)
            return text
        text = synthetic_text(self.namespace + seg.key, self.words_for(seg.length))
        self._cache[key] = text
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return text

    def messages(self, spec: RequestSpec) -> list[Message]:
        """Chat messages: system segments → system, answers → assistant, the rest → user;
        neighbours of one role are joined into one message."""
        out: list[Message] = []
        for seg in spec.prompt:
            role = {"system": "system", "answer": "assistant"}.get(seg.kind, "user")
            text = self.segment_text(seg)
            if out and out[-1].role == role:
                out[-1].content += " " + text
            else:
                out.append(Message(role, text))
        return out

    def prompt(self, spec: RequestSpec) -> str:
        """One string for ``/v1/completions``: the segments joined by spaces."""
        return " ".join(self.segment_text(s) for s in spec.prompt)

    def remember_answer(self, key: str, text: str) -> None:
        self.answers[key] = text

    def forget_answer(self, key: str) -> None:
        self.answers.pop(key, None)


_STREAM_WORDS = 1 << 20
_stream: str | None = None


def _word_stream() -> str:
    """A fixed pseudo-random text of 2^20 four-letter words (built once, ~5 MB)."""
    global _stream
    if _stream is None:
        idx = np.random.default_rng(20240601).integers(0, len(VOCAB), size=_STREAM_WORDS)
        _stream = " ".join(VOCAB[i] for i in idx) + " "
    return _stream


def synthetic_text(key: str, words: int) -> str:
    """``words`` pseudo-words, a pure function of ``key`` (equal keys → equal text): a slice of
    a fixed pseudo-random text, starting at an offset hashed from the key (cheap: no generator
    per prompt)."""
    if words <= 0:
        return ""
    stream = _word_stream()
    out = []
    off = zlib.crc32(key.encode()) % _STREAM_WORDS
    left = words
    while left > 0:
        n = min(left, _STREAM_WORDS - off)
        out.append(stream[off * 5 : (off + n) * 5])
        left -= n
        off = 0
    return "".join(out)[:-1]
