"""Deterministic pseudo-output for one sequence: token ids, their text, and stop strings.

Token ``k`` of a sequence is drawn from the tokenizer's output vocabulary by a mixed hash of
``(seed, k)``; the seed mixes the server's ``--seed``, the request's ``seed``, the choice index
and the prompt's token ids, so the same request gives the same text (like greedy decoding), a
different prompt a different one. Hashes of tuples of integers only: Python salts the hash of a
string per process, so two servers with the same ``--seed`` give the same text.

Logprobs (``top_logprobs``): at position ``k`` the distribution puts p0 ∈ [0.35, 0.95) (a hash
of ``(seed, k)``) on the token drawn, then (1 − p0)/2, (1 − p0)/4, … on the next ids of the
output vocabulary, so the token drawn is the greedy choice. ``--alter-tokens F``: at a share F of
positions (a hash of ``(seed, k)``, so the same positions for the same request) the runner-up
is drawn instead and the two swap their probabilities, as a lower precision flips a close call:
the text differs from an unaltered server's at exactly those tokens.

Stop strings behave as vLLM's detokenizer does: they are looked for once more than
``min_tokens`` tokens exist, the text is cut before the match (or after it with
``include_stop_str_in_output``), and while stop strings are active a streamed delta holds back
the last ``max(len(stop)) - 1`` characters, which could be the start of a stop string.
"""

from __future__ import annotations

import math
import zlib
from array import array
from collections.abc import Sequence

from servefleet.sim.server.tokenizer import Tokenizer


def sequence_seed(
    server_seed: int, request_seed: int | None, index: int, prompt_ids: Sequence[int]
) -> int:
    """A stable 64-bit seed (``hash`` of strings is salted per process; crc32 is not)."""
    h = zlib.crc32(array("q", prompt_ids).tobytes())
    return hash((server_seed, -1 if request_seed is None else request_seed, index, h))


_UNIT = 1 / 2**32
_MASK = (1 << 64) - 1


def _draw(seed: int, *key: int) -> int:
    """64 well-mixed bits from ``(seed, *key)``, the same in every process: Python's hash of
    a tuple of integers, through SplitMix64's finaliser. The tuple hash alone is close to
    linear in its last item, so the draws of two seeds could agree for several positions
    in a row at some offset (two different prompts sharing a run of output words)."""
    x = hash((seed, *key)) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _unit(seed: int, k: int, salt: int) -> float:
    """A number in [0, 1) from ``(seed, k, salt)``, the same in every process."""
    return (_draw(seed, k, salt) >> 32) * _UNIT


class OutputText:
    __slots__ = (
        "_alter",
        "_buffer",
        "_hold",
        "_include_stop",
        "_min_tokens",
        "_seed",
        "_sent",
        "_stops",
        "_tail",
        "_tail_len",
        "_tok",
        "_total",
        "first_space",
        "stop_reason",
    )

    def __init__(
        self,
        tokenizer: Tokenizer,
        seed: int,
        stops: Sequence[str] = (),
        min_tokens: int = 0,
        include_stop_str_in_output: bool = False,
        first_space: bool = True,
        alter: float = 0.0,
    ) -> None:
        self._tok = tokenizer
        self._alter = alter
        self._seed = seed
        self._stops = tuple(s for s in stops if s)
        self._min_tokens = min_tokens
        self._include_stop = include_stop_str_in_output
        longest = max((len(s) for s in self._stops), default=0)
        self._tail_len = max(0, longest - 1)
        self._hold = 0 if include_stop_str_in_output else self._tail_len
        self._tail = ""
        self._buffer = ""
        self._total = 0
        self._sent = 0
        self.first_space = first_space
        """False for the first token of a new chat message (no leading space)."""
        self.stop_reason: str | None = None

    def token_id(self, k: int) -> int:
        """The id of output token ``k`` (computed when the engine samples it)."""
        vocab = self._tok.output_ids
        i = self._greedy(k)
        if self._alter and self.altered(k):
            i = (i + 1) % len(vocab)
        return vocab[i]

    def _greedy(self, k: int) -> int:
        """The index in the output vocabulary of the likeliest token at position ``k``."""
        return _draw(self._seed, k) % len(self._tok.output_ids)

    def altered(self, k: int) -> bool:
        """Whether token ``k`` is the runner-up (``--alter-tokens``)."""
        return _unit(self._seed, k, -2) < self._alter

    def top_logprobs(self, k: int, n: int) -> list[tuple[int, float]]:
        """The ``max(n, 1)`` most likely ids at position ``k`` with their logprobs, the token
        drawn (``token_id(k)``) first."""
        vocab = self._tok.output_ids
        size = len(vocab)
        i = self._greedy(k)
        p0 = 0.35 + 0.6 * _unit(self._seed, k, -1)
        probs = [p0] + [(1 - p0) * 0.5**j for j in range(1, max(n, 2))]
        ids = [vocab[(i + j) % size] for j in range(len(probs))]
        if self._alter and self.altered(k):
            ids[0], ids[1] = ids[1], ids[0]
        return [(ids[j], math.log(probs[j])) for j in range(max(n, 1))]

    def advance(self, k: int, token_id: int) -> str:
        """Token ``k`` is delivered: the new visible text (maybe empty). Sets ``stop_reason``
        when a stop string matched; later tokens must not be asked for then."""
        piece = self._tok.piece(token_id, first=(k == 0 and not self.first_space))
        if not self._stops:
            return piece
        window = self._tail + piece
        before = self._total
        self._total += len(piece)
        buf = self._buffer + piece
        if k + 1 > self._min_tokens:
            at, stop = -1, None
            for s in self._stops:
                i = window.find(s)
                if i >= 0 and (at < 0 or i < at):
                    at, stop = i, s
            if stop is not None:
                cut = before - len(self._tail) + at + (len(stop) if self._include_stop else 0)
                self.stop_reason = stop
                delta = buf[: max(0, cut - self._sent)]
                self._sent = max(self._sent, cut)
                self._buffer = ""
                return delta
        upto = max(self._sent, self._total - self._hold)
        delta = buf[: upto - self._sent]
        self._buffer = buf[upto - self._sent :]
        self._sent = upto
        self._tail = window[-self._tail_len :] if self._tail_len else ""
        return delta

    def flush(self) -> str:
        """Text held back for stop strings, released when the sequence ends by length."""
        rest, self._buffer = self._buffer, ""
        self._sent = self._total
        return rest
