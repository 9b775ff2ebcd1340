"""What the gateway reads from an OpenAI request body: vLLM's own reading of it
(``servefleet.protocol``: the same types, coercions and refusals), and from that, what
admission, routing and resumption need.

The body is forwarded as received (the bytes, not a re-serialisation): the replica reads it
exactly as the gateway did. Only a stream resumed on another replica gets a new body
(``resume_body``), built from the values as read (``"max_tokens": "10"`` is 10 there).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from servefleet import protocol
from servefleet.gateway.errors import GatewayError
from servefleet.protocol import ChatCompletionRequest, CompletionRequest, RequestError
from servefleet.routing.prefix import CHARS_PER_TOKEN, ids_prefix_hashes, text_prefix_hashes

COMPLETIONS, CHAT = "completions", "chat"
CHAT_TOKENS_PER_MESSAGE = 8
"""Upper bound of a chat template's tokens around one message (role, markers)."""
MODELS = {COMPLETIONS: CompletionRequest, CHAT: ChatCompletionRequest}


@dataclass(slots=True)
class ParsedRequest:
    kind: str
    body: dict[str, Any]
    """The JSON as received."""
    req: CompletionRequest | ChatCompletionRequest
    """vLLM's reading of it."""
    stream: bool
    model: str | None
    max_tokens: int | None
    """The output tokens asked for, as vLLM takes them (completions: 16 when unset)."""
    prompt_text: str | None
    """The prompt (completions), or every chat message rendered as ``role\\ncontent\\n``."""
    prompt_ids: list[int] | None
    longest_bytes: int
    """UTF-8 bytes of the longest prompt (plus template tokens): no tokenizer makes more
    tokens of it than this."""
    longest_ids: int | None
    """Token ids of the longest prompt when every prompt is given as ids (an exact count)."""
    token_estimate: int
    """Tokens of all prompts, estimated (characters / 4), for load bookkeeping."""
    resumable: bool

    @property
    def choices(self) -> int:
        """Completions generated per prompt (``n``, or ``best_of`` when larger)."""
        best_of = self.body.get("best_of")
        return max(self.req.n, best_of if isinstance(best_of, int) else 0)

    @property
    def include_usage(self) -> bool:
        o = self.req.stream_options
        return bool(o and o.include_usage)

    def prefix_hashes(self) -> tuple[int, ...]:
        if self.prompt_ids is not None:
            return ids_prefix_hashes(self.prompt_ids)
        return text_prefix_hashes(self.prompt_text or "")

    def tokenize_body(self) -> dict[str, Any] | None:
        """The /tokenize body that counts the longest prompt (None: nothing to count)."""
        req = self.req
        if isinstance(req, ChatCompletionRequest):
            body: dict[str, Any] = {
                "messages": self.body["messages"],
                "add_generation_prompt": req.add_generation_prompt,
                "continue_final_message": req.continue_final_message,
            }
        else:
            texts = req.texts()
            if not texts:
                return None
            body = {"prompt": max(texts, key=len)}
        if self.model:
            body["model"] = self.model
        return body


def _bad(err: RequestError) -> GatewayError:
    """vLLM's 400, as a replica would have answered it (its type, and its code: 400)."""
    return GatewayError(400, err.message, "invalid_request", err.param, vllm_type=err.err_type)


def load_json(raw: bytes) -> Any:
    """The body's JSON, or vLLM's 400; a string anywhere in it (a key or a value) that is not
    text — a lone surrogate, which JSON escapes allow and no tokenizer, header or log takes —
    is the 400 vLLM's tokenizer gives for one in a prompt."""
    try:
        data = protocol.load_body(raw)
        check_strings(data)
    except RequestError as exc:
        raise _bad(exc) from None
    return data


def check_strings(data: Any) -> None:
    """Every string in ``data`` (JSON) encodes as UTF-8, else ``RequestError``."""
    todo = [data]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            protocol.check_text(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                protocol.check_text(k)
                todo.append(x)
        elif isinstance(v, list):
            todo.extend(v)


def _part_text(part: dict[str, Any]) -> str:
    if part.get("type") == "text":
        return part["text"]
    return json.dumps(part, sort_keys=True)


def parse_request(kind: str, data: Any) -> ParsedRequest:
    """vLLM's reading of ``data``, or the 400 vLLM would answer (``GatewayError``)."""
    try:
        req = protocol.parse(MODELS[kind], data)
    except RequestError as exc:
        raise _bad(exc) from None
    body = data
    ids: list[int] | None = None
    text: str | None = None
    longest_ids: int | None = None
    simple = req.n == 1 and not body.get("best_of") and not req.use_beam_search
    opts = req.stream_options
    simple = simple and not (opts is not None and opts.continuous_usage_stats)
    if isinstance(req, CompletionRequest):
        prompts = req.prompts()
        texts = [p for p in prompts if isinstance(p, str)]
        if len(texts) == len(prompts):
            text = "".join(texts)
            longest = max(len(t.encode("utf-8")) for t in texts)
        else:
            ids = [t for p in prompts if not isinstance(p, str) for t in p]
            longest_ids = max(len(p) for p in prompts)
            longest = longest_ids
        resumable = simple and isinstance(req.prompt, str) and not req.echo
        estimate = len(ids) if ids is not None else math.ceil(len(text or "") / CHARS_PER_TOKEN)
        max_tokens = req.max_tokens
    else:
        rendered = []
        for m in req.messages:
            c = m.content
            content = c if isinstance(c, str) else "".join(_part_text(p) for p in c or [])
            rendered.append(f"{m.role}\n{content}\n")
        text = "".join(rendered)
        longest = len(text.encode("utf-8")) + CHAT_TOKENS_PER_MESSAGE * (len(rendered) + 1)
        resumable = (
            simple
            and not req.tools
            and not req.continue_final_message
            and req.add_generation_prompt
            and not req.echo
        )
        estimate = math.ceil(len(text) / CHARS_PER_TOKEN)
        max_tokens = req.requested_max_tokens
    return ParsedRequest(
        kind, body, req, bool(req.stream), req.model, max_tokens, text, ids, longest,
        longest_ids, estimate, resumable,
    )  # fmt: skip


def resume_body(parsed: ParsedRequest, text_sent: str, tokens_sent: int) -> dict[str, Any]:
    """The body that continues ``parsed`` on another replica after ``text_sent``
    (``tokens_sent`` tokens) reached the client: completions get the text appended to the
    prompt; chat gets a partial assistant message to continue (``continue_final_message``)."""
    body = dict(parsed.body)
    req = parsed.req
    body["stream"] = True
    if isinstance(req, CompletionRequest):
        assert isinstance(req.prompt, str)
        body["prompt"] = req.prompt + text_sent
    else:
        body["messages"] = [*body["messages"], {"role": "assistant", "content": text_sent}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    for key in ("max_tokens", "max_completion_tokens"):
        v = getattr(req, key, None)
        if v is not None and (key in body or isinstance(req, CompletionRequest)):
            body[key] = max(1, v - tokens_sent)  # completions: vLLM's default 16 counts too
    if "min_tokens" in body:
        body["min_tokens"] = max(0, req.min_tokens - tokens_sent)
    return body
