"""What goes on the wire for a ``RequestSpec``: the OpenAI body, headers and a fresh record."""

from __future__ import annotations

import json
from dataclasses import dataclass

from servefleet.bench.client import Request
from servefleet.bench.prompts import PromptRenderer
from servefleet.records import RequestRecord
from servefleet.workload import RequestSpec


@dataclass(frozen=True, slots=True)
class Target:
    """The server and how to talk to it."""

    base_url: str
    model: str
    endpoint: str = "chat"
    """``chat`` (/v1/chat/completions) or ``completions`` (/v1/completions)."""
    ignore_eos: bool = True
    continuous_usage: bool = False
    """Ask for vLLM's per-chunk usage (exact tokens per chunk)."""
    extra_body: tuple[tuple[str, object], ...] = ()

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path


def build_request(
    spec: RequestSpec, target: Target, renderer: PromptRenderer, base_headers: dict[str, str]
) -> Request:
    body: dict[str, object] = {
        "model": target.model,
        "max_tokens": spec.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True}
        | ({"continuous_usage_stats": True} if target.continuous_usage else {}),
        "temperature": 0.0,
    }
    if target.ignore_eos:
        body["ignore_eos"] = True
    if target.endpoint == "chat":
        body["messages"] = [{"role": m.role, "content": m.content} for m in renderer.messages(spec)]
    else:
        body["prompt"] = renderer.prompt(spec)
    if spec.user_id:
        body["user"] = spec.user_id
    for k, v in target.extra_body:
        body[k] = v
    headers = dict(base_headers)
    headers["X-Request-Id"] = spec.request_id
    if spec.session_id:
        headers["X-Session-ID"] = spec.session_id
    rec = RequestRecord(
        request_id=spec.request_id,
        class_name=spec.class_name,
        scheduled_time=spec.arrival_time,
        send_time=spec.arrival_time,
        target_prompt_tokens=spec.prompt_tokens,
        target_output_tokens=spec.max_tokens,
        session_id=spec.session_id,
        user_id=spec.user_id,
        turn=spec.turn,
    )
    return Request(
        target.url,
        json.dumps(body, separators=(",", ":")).encode(),
        headers,
        rec,
        chat=target.endpoint == "chat",
        keep_text=spec.session_id is not None,
    )
