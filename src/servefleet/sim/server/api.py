"""HTTP bodies: the OpenAI/vLLM request models (pydantic) and vLLM's error shape.

Requests accept extra fields, as vLLM's do (``OpenAIBaseModel`` has ``extra="allow"``); what the
sim-server cannot model (logprobs, beam search, tool calling, images) is refused with a 400
that names the field, rather than silently ignored.

Errors have vLLM's body: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

INT64_MAX = 2**63 - 1


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


class FieldError(ValueError):
    """A check on a request that names the field at fault (the error's ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def validation_error(exc: ValidationError) -> APIError:
    """A pydantic error as vLLM's 400: every problem with its field, the first as ``param``."""
    problems = []
    first = None
    for e in exc.errors(include_url=False):
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            first = first or cause.param
            problems.append(str(cause))
            continue
        loc = ".".join(str(p) for p in e.get("loc", ()))
        first = first or loc or None
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        problems.append(f"{loc}: {msg}" if loc else msg)
    return APIError("; ".join(problems) or str(exc), param=first)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


StopParam = str | list[str] | None
NonNegInt = Annotated[int, Field(ge=0)]


class _Sampling(_Body):
    """Fields shared by completions and chat."""

    model: str | None = None
    n: int = Field(default=1, ge=1, le=128)
    seed: int | None = Field(default=None, ge=-(2**63), le=INT64_MAX)
    stop: StopParam = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    include_stop_str_in_output: bool = False
    use_beam_search: bool = False
    prompt_logprobs: int | None = None
    request_id: str | None = None

    @model_validator(mode="after")
    def _check_common(self):
        if self.stream_options is not None and not self.stream:
            raise FieldError(
                "Stream options can only be defined when `stream=True`.", "stream_options"
            )
        if self.use_beam_search:
            raise FieldError("beam search is not modelled by the sim-server", "use_beam_search")
        if self.prompt_logprobs is not None:
            raise FieldError("logprobs are not modelled by the sim-server", "prompt_logprobs")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Sampling):
    prompt: list[NonNegInt] | list[list[NonNegInt]] | str | list[str] | None = None
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True

    @model_validator(mode="before")
    @classmethod
    def _null_max_tokens(cls, data: Any) -> Any:
        """``"max_tokens": null`` means the default (16), as in vLLM."""
        if isinstance(data, dict) and "max_tokens" in data and data["max_tokens"] is None:
            data = {**data, "max_tokens": 16}
        return data

    @model_validator(mode="after")
    def _check(self):
        p = self.prompt
        if p is None or p == "" or (isinstance(p, list) and len(p) == 0):
            raise FieldError(
                "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
            )
        if self.logprobs is not None:
            raise FieldError("logprobs are not modelled by the sim-server", "logprobs")
        if self.suffix:
            raise FieldError("suffix is not supported (nor by vLLM)", "suffix")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        assert isinstance(p, list)
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        c = self.content
        if c is None:
            return ""
        if isinstance(c, str):
            return c
        parts = []
        for i, part in enumerate(c):
            kind = part.get("type")
            if kind != "text":
                raise FieldError(
                    f"content part of type {kind!r}: only text is modelled by the sim-server",
                    f"messages.content.{i}",
                )
            parts.append(TextPart.model_validate(part).text)
        return "\n".join(parts)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = "none"
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False

    @model_validator(mode="after")
    def _check(self):
        if self.logprobs:
            raise FieldError("logprobs are not modelled by the sim-server", "logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
        if self.tools and self.tool_choice not in (None, "none"):
            raise FieldError(
                "tool calling is not modelled by the sim-server (only tool_choice='none')",
                "tool_choice",
            )
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class TokenizeRequest(_Body):
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


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
