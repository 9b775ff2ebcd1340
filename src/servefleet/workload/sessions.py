"""The requests of a unit: the first turn, and each next turn built from the one that finished.

Turn k+1 resends the whole history: the prompt of turn k (system prompt, earlier user messages
and answers), then turn k's answer as ``Segment(output_key(id_k), actual_output_tokens,
"answer")``, then the new user message. It arrives ``think`` seconds after turn k finished.

Ids: the first turn has the unit's root id (``r000123``); turn k > 0 has ``<root>.<k>``. Every
user message has its own key ``user_key(request_id)`` (``u:<request_id>``).
"""

from __future__ import annotations

from servefleet.tokens import user_key

from .classes import Unit
from .types import RequestSpec, Segment, output_key


def root_of(request_id: str) -> str:
    return request_id.split(".", 1)[0]


def first_request(unit: Unit, root: str, arrival_time: float) -> RequestSpec:
    user_tokens, max_tokens = unit.turns[0]
    prompt: tuple[Segment, ...] = (Segment(user_key(root), user_tokens, "user"),)
    if unit.system is not None:
        prompt = (unit.system, *prompt)
    return RequestSpec(
        request_id=root,
        class_name=unit.class_name,
        prompt=prompt,
        max_tokens=max_tokens,
        arrival_time=arrival_time,
        session_id=f"s-{root}" if unit.is_session else None,
        user_id=unit.user_id or f"u-{root}",
    )


def next_request(
    unit: Unit, prev: RequestSpec, finish_time: float, output_tokens: int
) -> RequestSpec | None:
    """The turn after ``prev`` (None when ``prev`` was the last)."""
    k = prev.turn + 1
    if k >= len(unit.turns):
        return None
    rid = f"{root_of(prev.request_id)}.{k}"
    user_tokens, max_tokens = unit.turns[k]
    answer = Segment(output_key(prev.request_id), output_tokens, "answer")
    return RequestSpec(
        request_id=rid,
        class_name=prev.class_name,
        prompt=(*prev.prompt, answer, Segment(user_key(rid), user_tokens, "user")),
        max_tokens=max_tokens,
        arrival_time=finish_time + unit.thinks[k - 1],
        session_id=prev.session_id,
        user_id=prev.user_id,
        turn=k,
    )
