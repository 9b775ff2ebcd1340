"""Tokens as far as prefix caching can tell: prompt segments and chained block hashes.

The bottom layer that the workload (which writes prompts as segments), the engine (which
caches KV blocks by the hash of their tokens) and routing (which hashes prompt prefixes) share.

A prompt is a sequence of *segments*. A segment is a run of tokens identified by a key: two
segments with the same key hold byte-identical tokens. That is all the simulator needs to model
prefix caching (blocks are hashed from segment keys), and all the live benchmark needs to render
prompts (a segment key seeds its synthetic text, so equal keys render equal text).

A ``block`` segment is a block of a replayed trace (Mooncake's ``hash_ids``): any request may
hold it, with or without a session. An ``answer`` segment stands for the output of an earlier
turn of a session: the simulator
treats it as tokens of that request's output (key ``output_key(request_id)``, the same key the
engine gives to what it generated), the live benchmark substitutes the text it actually
received.

A KV block's hash chains its parent's: ``hash((parent, content))`` with ``content`` a value
equal for equal token runs (``TokenContent.block_content``), so two requests share a block's
hash only if they share every token up to its end.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

SegmentKind = Literal["system", "user", "answer", "block"]


@dataclass(frozen=True, slots=True)
class Segment:
    """``length`` tokens whose content is identified by ``key``."""

    key: str
    length: int
    kind: SegmentKind = "user"

    def __post_init__(self) -> None:
        if self.length < 0:
            raise ValueError(f"segment {self.key!r}: length must be >= 0, got {self.length}")


def user_key(request_id: str) -> str:
    """The segment key of the user message a request adds (every request's is its own)."""
    return f"u:{request_id}"


def output_key(request_id: str) -> str:
    """The segment key of what ``request_id`` generated (shared by engine and workload)."""
    return f"{request_id}:out"


class TokenContent(Protocol):
    """What the tokens of a request are, as far as prefix caching can tell."""

    def block_content(self, start: int, end: int) -> Hashable:
        """A value equal for equal token runs ``[start, end)`` (prompt then output)."""
        ...

    def block_contents(self, first: int, last: int, size: int) -> list[Hashable]:
        """``block_content`` of blocks ``first`` to ``last - 1`` of ``size`` tokens."""
        ...

    @property
    def output_key(self) -> Hashable | None:
        """A key that only this request's output tokens have in their content (no other
        request's tokens equal them unless its ``prompt_keys`` has it), or None."""
        ...

    @property
    def prompt_keys(self) -> Sequence[Hashable]:
        """The keys the prompt's content is made of (with ``output_key``: a prompt that does
        not have a request's output key has none of its output tokens)."""
        ...


class SegmentContent:
    """Tokens described by segments (the simulator): a token is (segment key, offset).

    Output tokens belong to the segment ``output_key(request_id)``, the key a later turn of a
    session uses for this answer, so history resent by the next turn hits the prefix cache.
    """

    __slots__ = ("_keys", "_num_prompt", "_out_key", "_starts")

    @property
    def output_key(self) -> str:
        return self._out_key

    @property
    def prompt_keys(self) -> list[str]:
        return self._keys

    def __init__(self, segments: Sequence[Segment], request_id: str) -> None:
        starts, keys, pos = [], [], 0
        for seg in segments:
            if seg.length:
                starts.append(pos)
                keys.append(seg.key)
                pos += seg.length
        self._starts = starts
        self._keys = keys
        self._num_prompt = pos
        self._out_key = output_key(request_id)

    def block_content(self, start: int, end: int) -> Hashable:
        num_prompt = self._num_prompt
        if start >= num_prompt:  # all output tokens
            return ((self._out_key, start - num_prompt, end - num_prompt),)
        i = bisect_right(self._starts, start) - 1
        seg_start = self._starts[i]
        seg_end = self._starts[i + 1] if i + 1 < len(self._starts) else num_prompt
        if end <= seg_end:  # inside one segment (the common case)
            return ((self._keys[i], start - seg_start, end - seg_start),)
        return self._pieces(start, end)

    def block_contents(self, first: int, last: int, size: int) -> list[Hashable]:
        """``block_content`` of blocks ``first`` to ``last - 1``, a segment's run of whole
        blocks at a time."""
        out: list[Hashable] = []
        starts, keys, num_prompt = self._starts, self._keys, self._num_prompt
        start, end = first * size, last * size
        while start < end:
            if start >= num_prompt:
                key, p = self._out_key, num_prompt
                out += [((key, s - p, s - p + size),) for s in range(start, end, size)]
                break
            i = bisect_right(starts, start) - 1
            seg_start = starts[i]
            seg_end = starts[i + 1] if i + 1 < len(starts) else num_prompt
            stop = min(end, start + (seg_end - start) // size * size)
            if stop > start:  # whole blocks inside the segment
                key = keys[i]
                out += [
                    ((key, s - seg_start, s - seg_start + size),) for s in range(start, stop, size)
                ]
                start = stop
            else:  # a block across segments
                out.append(self._pieces(start, start + size))
                start += size
        return out

    def _pieces(self, start: int, end: int) -> tuple:
        pieces = []
        pos = start
        while pos < end:
            if pos >= self._num_prompt:
                p = self._num_prompt
                pieces.append((self._out_key, pos - p, end - p))
                break
            i = bisect_right(self._starts, pos) - 1
            seg_start = self._starts[i]
            seg_end = self._starts[i + 1] if i + 1 < len(self._starts) else self._num_prompt
            stop = min(end, seg_end)
            pieces.append((self._keys[i], pos - seg_start, stop - seg_start))
            pos = stop
        return tuple(pieces)


class TokenIdContent:
    """Tokens as real ids (the sim-server): prompt ids, then generated ids appended."""

    __slots__ = ("ids",)

    output_key = None
    """Generated ids may equal any other request's."""
    prompt_keys = ()

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.ids = list(prompt_ids)

    def block_content(self, start: int, end: int) -> Hashable:
        return tuple(self.ids[start:end])

    def block_contents(self, first: int, last: int, size: int) -> list[Hashable]:
        ids = self.ids
        return [tuple(ids[i * size : (i + 1) * size]) for i in range(first, last)]


def extend_block_hashes(
    content: TokenContent, hashes: list[int], num_blocks: int, block_size: int
) -> list[int]:
    """Extend ``hashes`` (the chained hashes of the first full blocks of ``content``) to
    ``num_blocks`` blocks of ``block_size`` tokens; returns it."""
    have = len(hashes)
    if have >= num_blocks:
        return hashes
    parent = hashes[-1] if hashes else 0
    if num_blocks == have + 1:  # one block (a decode's)
        hashes.append(
            hash((parent, content.block_content(have * block_size, num_blocks * block_size)))
        )
        return hashes
    for piece in content.block_contents(have, num_blocks, block_size):
        parent = hash((parent, piece))
        hashes.append(parent)
    return hashes
