"""What the gateway reads from an OpenAI request body: enough to admit, route and resume it.

The body is forwarded as received (the bytes, not a re-serialisation), except when a stream
is resumed on another replica (``resume_body``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from servefleet.gateway.errors import GatewayError
from servefleet.routing.prefix import CHARS_PER_TOKEN, ids_prefix_hashes, text_prefix_hashes

COMPLETIONS, CHAT = "completions", "chat"
CHAT_TOKENS_PER_MESSAGE = 8
"""Upper bound of a chat template's tokens around one message (role, markers)."""


@dataclass(slots=True)
class ParsedRequest:
    kind: str
    body: dict[str, Any]
    stream: bool
    model: str | None
    max_tokens: int | None
    user: str | None
    prompt_text: str | None
    """The prompt (completions), or every chat message rendered as ``role\\ncontent\\n``."""
    prompt_ids: list[int] | None
    token_upper_bound: int
    """No tokenizer makes more tokens than this (UTF-8 bytes, plus template tokens)."""
    token_estimate: int
    resumable: bool
    include_usage: bool

    def prefix_hashes(self) -> tuple[int, ...]:
        if self.prompt_ids is not None:
            return ids_prefix_hashes(self.prompt_ids)
        return text_prefix_hashes(self.prompt_text or "")


def _bad(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request", param)


def load_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object")
    return body


def _int_field(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"{name} must be an integer, got {json.dumps(v)[:40]}", name)
    return v


def _message_text(m: Any, i: int) -> tuple[str, str]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise _bad(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
    content = m.get("content")
    if content is None:
        return m["role"], ""
    if isinstance(content, str):
        return m["role"], content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, dict):
                parts.append(json.dumps(p, sort_keys=True))
            else:
                raise _bad(f"messages[{i}].content parts must be objects", f"messages[{i}]")
        return m["role"], "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of parts", f"messages[{i}]")


def parse_request(kind: str, body: dict[str, Any]) -> ParsedRequest:
    stream = bool(body.get("stream", False))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model must be a string", "model")
    max_tokens = _int_field(body, "max_tokens")
    if kind == CHAT and body.get("max_completion_tokens") is not None:
        max_tokens = _int_field(body, "max_completion_tokens")
    n = _int_field(body, "n") or 1
    user = body.get("user") if isinstance(body.get("user"), str) else None
    opts = body.get("stream_options")
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    continuous = isinstance(opts, dict) and bool(opts.get("continuous_usage_stats"))
    ids: list[int] | None = None
    text: str | None = None
    simple = n == 1 and not body.get("best_of") and not continuous
    if kind == COMPLETIONS:
        p = body.get("prompt")
        if isinstance(p, str):
            text = p
        elif (
            isinstance(p, list)
            and p
            and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
        ):
            ids = p
        elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            text = "".join(p)
            simple = simple and len(p) == 1
        elif isinstance(p, list) and p and all(isinstance(x, list) for x in p):
            ids = [t for x in p for t in x if isinstance(t, int)]
            simple = simple and len(p) == 1
        else:
            raise _bad(
                "prompt must be a string, a list of strings or a list of token ids", "prompt"
            )
        bound = len(ids) if ids is not None else len(text.encode("utf-8", "surrogatepass"))
        resumable = simple and text is not None and isinstance(p, str) and not body.get("echo")
    elif kind == CHAT:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _bad("messages must be a non-empty list", "messages")
        rendered = [_message_text(m, i) for i, m in enumerate(msgs)]
        text = "".join(f"{r}\n{c}\n" for r, c in rendered)
        bound = len(text.encode("utf-8", "surrogatepass")) + CHAT_TOKENS_PER_MESSAGE * (
            len(msgs) + 1
        )
        resumable = (
            simple
            and not body.get("tools")
            and not body.get("continue_final_message")
            and body.get("add_generation_prompt", True) is not False
            and not body.get("echo")
        )
    else:  # pragma: no cover
        raise ValueError(kind)
    est = len(ids) if ids is not None else math.ceil(len(text or "") / CHARS_PER_TOKEN)
    return ParsedRequest(
        kind, body, stream, model, max_tokens, user, text, ids, bound, est, resumable, include_usage
    )


def resume_body(req: ParsedRequest, text_sent: str, tokens_sent: int) -> dict[str, Any]:
    """The body that continues ``req`` on another replica after ``text_sent`` (``tokens_sent``
    tokens) reached the client: completions get the text appended to the prompt; chat gets a
    partial assistant message to continue (``continue_final_message``)."""
    body = dict(req.body)
    if req.kind == COMPLETIONS:
        body["prompt"] = body["prompt"] + text_sent
    else:
        body["messages"] = [*body["messages"], {"role": "assistant", "content": text_sent}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int):
            body[key] = max(1, body[key] - tokens_sent)
    if isinstance(body.get("min_tokens"), int):
        body["min_tokens"] = max(0, body["min_tokens"] - tokens_sent)
    return body
