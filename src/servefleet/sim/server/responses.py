"""Response bodies in vLLM's shapes: streamed chunks (SSE) and whole responses.

Field sets and order follow vLLM's pydantic models and how it serialises them
(vllm/entrypoints/openai/{completion,chat_completion}/serving.py): stream chunks are dumped
with ``exclude_unset`` (a chat token chunk's delta is just ``{"content": ...}``; the first chunk
of each chat choice is role-only, ``{"role": "assistant", "content": ""}``, sent with the first
token); the final usage chunk has ``"choices": []``; whole responses carry every field, nulls
included. The hot path (one chunk per token) is string templates, not ``json.dumps`` of dicts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from servefleet.sim.server.loop import Seq

_dumps = json.dumps


def js(value: Any) -> str:
    return _dumps(value, ensure_ascii=False)


def new_request_id(header: str | None) -> str:
    """vLLM takes an ``X-Request-Id`` header as the base id when given, else a random one."""
    return header if header else uuid.uuid4().hex


def usage(
    prompt_tokens: int, completion_tokens: int, cached: int | None, details: bool
) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }
    if details and cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


def _usage_json(u: dict[str, Any]) -> str:
    return js({k: v for k, v in u.items() if v is not None})


class StreamFormat:
    """Chunks of one streamed response (completion or chat)."""

    def __init__(
        self,
        chat: bool,
        request_id: str,
        model: str,
        json_safe: bool,
        prompt_lens: Sequence[int],
        n: int,
        role: str = "assistant",
        continuous_usage: bool = False,
    ) -> None:
        self.chat = chat
        self.created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = (
            f'data: {{"id":{js(request_id)},"object":"{obj}","created":{self.created},'
            f'"model":{js(model)},"choices":[{{"index":'
        )
        self.usage_head = (
            f'data: {{"id":{js(request_id)},"object":"{obj}","created":{self.created},'
            f'"model":{js(model)},"choices":[],"usage":'
        )
        self.role = role
        self.json_safe = json_safe
        self.prompt_lens = prompt_lens
        self.n = n
        self.continuous_usage = continuous_usage

    def _text(self, text: str) -> str:
        if self.json_safe and '"' not in text and "\\" not in text:
            return f'"{text}"'
        return js(text)

    def _usage_tail(self, seq: Seq) -> str:
        if not self.continuous_usage:
            return ""
        p = self.prompt_lens[seq.index // self.n]
        return ',"usage":' + _usage_json(usage(p, seq.n_out, None, False))

    def role_chunk(self, index: int, prompt_len: int) -> str:
        cu = ""
        if self.continuous_usage:
            cu = ',"usage":' + _usage_json(usage(prompt_len, 0, None, False))
        return (
            f'{self.head}{index},"delta":{{"role":{js(self.role)},"content":""}},'
            f'"logprobs":null,"finish_reason":null}}],"prompt_token_ids":null{cu}}}\n\n'
        )

    def echo_chunk(self, index: int, text: str) -> str:
        return (
            f'{self.head}{index},"delta":{{"content":{js(text)}}},"logprobs":null,'
            f'"finish_reason":null}}]}}\n\n'
        )

    def chunk(self, seq: Seq, text: str, finish: str | None, stop_reason: str | None) -> str:
        t = self._text(text)
        ut = self._usage_tail(seq)
        if self.chat:
            if finish is None:
                return (
                    f'{self.head}{seq.index},"delta":{{"content":{t}}},"logprobs":null,'
                    f'"finish_reason":null,"token_ids":null}}]{ut}}}\n\n'
                )
            return (
                f'{self.head}{seq.index},"delta":{{"content":{t}}},"logprobs":null,'
                f'"finish_reason":"{finish}","stop_reason":{js(stop_reason)},'
                f'"token_ids":null}}]{ut}}}\n\n'
            )
        fr = "null" if finish is None else f'"{finish}"'
        return (
            f'{self.head}{seq.index},"text":{t},"logprobs":null,"finish_reason":{fr},'
            f'"stop_reason":{js(stop_reason)},"prompt_token_ids":null,"token_ids":null}}]'
            f"{ut}}}\n\n"
        )

    def usage_chunk(self, u: dict[str, Any]) -> str:
        return f"{self.usage_head}{_usage_json(u)}}}\n\n"


LogprobEntry = tuple[str, float, list[tuple[str, float]]]
"""One output token: its text, its logprob, the most likely tokens there with theirs."""


def chat_logprobs(entries: Sequence[LogprobEntry]) -> dict[str, Any]:
    """A chat choice's ``logprobs`` (vLLM's ``ChatCompletionLogProbs``)."""

    def one(token: str, lp: float) -> dict[str, Any]:
        return {"token": token, "logprob": lp, "bytes": list(token.encode())}

    return {
        "content": [
            {**one(t, lp), "top_logprobs": [one(a, b) for a, b in top]} for t, lp, top in entries
        ]
    }


def completion_logprobs(entries: Sequence[LogprobEntry]) -> dict[str, Any]:
    """A completion choice's ``logprobs`` (OpenAI's legacy shape, as vLLM returns it)."""
    offsets, at = [], 0
    for t, _, _ in entries:
        offsets.append(at)
        at += len(t)
    return {
        "text_offset": offsets,
        "token_logprobs": [lp for _, lp, _ in entries],
        "tokens": [t for t, _, _ in entries],
        "top_logprobs": [dict(top) for _, _, top in entries],
    }


def completion_response(
    request_id: str,
    model: str,
    choices: list[tuple[Seq, str]],
    u: dict[str, Any],
    logprobs: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": seq.index,
                "text": text,
                "logprobs": logprobs.get(seq.index) if logprobs else None,
                "finish_reason": seq.finish_reason,
                "stop_reason": seq.stop_reason,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
            for seq, text in choices
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": u,
        "kv_transfer_params": None,
    }


def chat_response(
    request_id: str,
    model: str,
    role: str,
    choices: list[tuple[Seq, str]],
    u: dict[str, Any],
    logprobs: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": seq.index,
                "message": {
                    "role": role,
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                },
                "logprobs": logprobs.get(seq.index) if logprobs else None,
                "finish_reason": seq.finish_reason,
                "stop_reason": seq.stop_reason,
                "token_ids": None,
            }
            for seq, text in choices
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": u,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }


def model_list(names: Sequence[str], root: str, max_model_len: int, created: int) -> dict:
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in names
        ],
    }
