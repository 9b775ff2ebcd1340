"""HTTP bodies: vLLM's request models (``servefleet.protocol``, shared with the gateway) and
vLLM's error shape.

What vLLM accepts, the sim-server accepts, read the same way (lax types, extra fields); what
the sim-server cannot model (streamed or prompt logprobs, beam search, tool calling, images) is
refused with a 400 that names the field, rather than silently ignored. Logprobs of a whole
response are modelled (``textgen``), up to 20 per token as vLLM's default ``--max-logprobs``.

Errors have vLLM's body: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import Field, ValidationError, model_validator

from servefleet import protocol
from servefleet.protocol import (
    FieldError,
    RequestError,
    SamplingRequest,
    VllmBody,
    request_error,
)


class APIError(Exception):
    """Becomes vLLM's error response."""

    def __init__(
        self,
        message: str,
        status: int = HTTPStatus.BAD_REQUEST,
        err_type: str = "BadRequestError",
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = int(status)
        self.err_type = err_type
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.err_type, self.status, self.param)


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": int(code)}}


def validation_error(exc: ValidationError) -> APIError:
    """A pydantic error as vLLM's 400 (``protocol.request_error``)."""
    return from_request_error(request_error(exc))


def from_request_error(err: RequestError) -> APIError:
    return APIError(err.message, err_type=err.err_type, param=err.param)


def _refuse_unmodelled(body: SamplingRequest) -> None:
    """What vLLM supports and the sim-server does not model: a 400 naming the field."""
    if body.use_beam_search:
        raise FieldError("beam search is not modelled by the sim-server", "use_beam_search")
    if body.prompt_logprobs is not None:
        raise FieldError("logprobs are not modelled by the sim-server", "prompt_logprobs")
    if body.n > 128:
        raise FieldError(f"n={body.n}: the sim-server models at most 128 choices", "n")


MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``."""


def _check_logprobs(n: int, stream: bool, param: str) -> None:
    if stream:
        raise FieldError(
            "logprobs of a streamed response are not modelled by the sim-server", param
        )
    if not 0 <= n <= MAX_LOGPROBS:
        raise FieldError(
            f"Requested sample logprobs of {n}, which is greater than max allowed: {MAX_LOGPROBS}",
            param,
        )


class CompletionRequest(protocol.CompletionRequest):
    @model_validator(mode="after")
    def _sim_refusals(self):
        _refuse_unmodelled(self)
        if self.logprobs is not None:
            _check_logprobs(self.logprobs, bool(self.stream), "logprobs")
        if self.suffix:
            raise FieldError("suffix is not supported (nor by vLLM)", "suffix")
        return self


class ChatMessage(protocol.ChatMessage):
    def text(self) -> str:
        c = self.content
        if c is None:
            return ""
        if isinstance(c, str):
            return c
        for i, part in enumerate(c):
            kind = part.get("type")
            if kind != "text":
                raise FieldError(
                    f"content part of type {kind!r}: only text is modelled by the sim-server",
                    f"messages.content.{i}",
                )
        return "\n".join(self.text_parts())


class ChatCompletionRequest(protocol.ChatCompletionRequest):
    messages: list[ChatMessage] = Field(min_length=1)  # type: ignore[assignment]

    @model_validator(mode="after")
    def _sim_refusals(self):
        _refuse_unmodelled(self)
        if self.logprobs:
            _check_logprobs(self.top_logprobs or 0, bool(self.stream), "top_logprobs")
        if self.tools and self.tool_choice not in (None, "none"):
            raise FieldError(
                "tool calling is not modelled by the sim-server (only tool_choice='none')",
                "tool_choice",
            )
        return self


class TokenizeRequest(VllmBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _check(self):
        if (self.prompt is None) == (self.messages is None):
            raise FieldError("give exactly one of `prompt` (text) or `messages` (chat)", "prompt")
        if self.continue_final_message and self.add_generation_prompt and self.messages:
            raise FieldError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
        return self


class DetokenizeRequest(VllmBody):
    model: str | None = None
    tokens: list[int]
