"""Who may share content: the one thing the fast path trusts a workload with, checked.

The plain rule caches every full block a request computes. The fast path does not cache the
blocks that hold a request's *own* content (``private_output``: no lookup could ever find
them), so it must know which content no other request will hold.

Rule: a request outside any session (``RequestSpec.session_id`` None) owns the content from its
own user message on: the segment keyed ``tokens.user_key(request_id)``, if its prompt's first
``user`` segment is that one, and its output (``tokens.output_key(request_id)``). No other
request's prompt may then hold either key. A request whose first ``user`` segment has another
key (a trace or a harness that writes its own keys), or none, owns nothing: every block of it
is cached as the plain rule caches it.

A request whose prompt holds content another request owned breaks the contract: its prefix
hits on that content would be lost (the owner's blocks were never cached), so
``ContentContractError`` is raised instead of a wrong answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from servefleet.tokens import Segment, output_key, user_key


class ContentContractError(ValueError):
    """A request resends content that another request outside any session owned."""


class OwnContent:
    """The keys owned by the requests seen so far (one for a whole fleet)."""

    __slots__ = ("_owned",)

    def __init__(self) -> None:
        self._owned: set[str] = set()

    def own_from(self, request_id: str, prompt: Sequence[Segment], in_session: bool) -> int:
        """Where ``request_id``'s own content starts (a token position; -1: it owns nothing).
        Raises ``ContentContractError`` if its prompt holds a key another request owned."""
        owned = self._owned
        mine = user_key(request_id)
        own = -1
        first_user = True
        pos = 0
        for seg in prompt:
            key = seg.key
            if key in owned:
                raise ContentContractError(
                    f"request {request_id!r} resends segment {key!r}, which a request outside "
                    f"any session owned (only a session's turns may resend a user message or "
                    f"an answer; key a repeated prompt's segments apart from its request's id)"
                )
            if seg.kind == "user" and first_user:
                first_user = False
                if key == mine and not in_session:
                    own = pos
            pos += seg.length
        if in_session:
            return -1
        if own < 0 and first_user:  # no user message: only its output is its own
            own = pos
        if own >= 0:
            if own < pos:
                owned.add(mine)
            owned.add(output_key(request_id))
        return own
