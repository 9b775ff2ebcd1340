"""The OpenAI request bodies as vLLM 0.26 reads them: one reading shared by the gateway (which
must never disagree with a replica about a body) and the sim-server (which must answer what
vLLM answers).

What vLLM does, and so what these models do (read from vLLM's ``protocol.py`` and
``SamplingParams``; no strictness of our own):

* pydantic in **lax mode** with extra fields allowed (``OpenAIBaseModel``): ``"10"`` is the int
  10, ``"no"``/``"off"``/``"0"`` are the bool false and ``"yes"``/``"1"`` true, ``10.0`` is 10,
  ``"maybe"`` is refused;
* ``max_tokens: null`` on /v1/completions means 16; ``stream_options`` needs a truthy
  ``stream`` (the raw value: vLLM checks it before coercion);
* the sampling ranges of ``SamplingParams._verify_args`` (n >= 1, temperature >= 0,
  top_p in (0, 1], ...), each a 400 naming its parameter;
* a lone surrogate (``"\\ud800"``) in a prompt passes pydantic but not the tokenizer: vLLM
  answers 400 with the ``UnicodeEncodeError`` text (``check_text``);
* a chat content part ``{"type": "text"}`` without a string ``text`` matches none of vLLM's
  content-part types: 400.

Errors are vLLM's shapes: pydantic errors become ``{"type": "Bad Request", "code": 400}``
(FastAPI's ``RequestValidationError`` handler), checks that vLLM raises as
``VLLMValidationError``/``ValueError`` become ``{"type": "BadRequestError", "code": 400}``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""vLLM's default ``max_tokens`` for /v1/completions (also when it is null)."""
PYDANTIC_ERROR_TYPE = "Bad Request"
"""vLLM's error ``type`` for a body pydantic refused (``HTTPStatus.BAD_REQUEST.phrase``)."""
CHECK_ERROR_TYPE = "BadRequestError"
"""vLLM's error ``type`` for a check it raises itself (``create_error_response``)."""
BODY_PARSE_ERROR = "There was an error parsing the body"
"""FastAPI's 400 detail for a body ``json.loads`` could not take (e.g. nested too deep)."""


class RequestError(ValueError):
    """A request vLLM refuses with 400: ``message``, ``param`` and vLLM's error ``type``."""

    def __init__(
        self, message: str, param: str | None = None, err_type: str = CHECK_ERROR_TYPE
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.err_type = err_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type,
                          "param": self.param, "code": 400}}  # fmt: skip


class FieldError(ValueError):
    """Raised inside a validator: a check that names its field (vLLM's
    ``VLLMValidationError(..., parameter=...)``); becomes a ``BadRequestError``."""

    def __init__(self, message: str, param: str | None = None, value: Any = None) -> None:
        if value is not None:
            message = f"{message} (parameter={param}, value={value})"
        super().__init__(message)
        self.param = param


def request_error(exc: ValidationError) -> RequestError:
    """A pydantic error as vLLM answers it: every problem with its field, the first field (or
    the parameter of a vLLM check) as ``param``."""
    problems = []
    param = None
    checks = False
    for e in exc.errors(include_url=False):
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            param = param or cause.param
            problems.append(str(cause))
            checks = True
            continue
        loc = ".".join(str(p) for p in e.get("loc", ()))
        param = param or loc or None
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        problems.append(f"{loc}: {msg}" if loc else msg)
    err_type = CHECK_ERROR_TYPE if checks and len(problems) == 1 else PYDANTIC_ERROR_TYPE
    return RequestError("; ".join(problems) or str(exc), param, err_type)


def load_body(raw: bytes) -> Any:
    """``json.loads`` as FastAPI calls it, with its 400s (vLLM answers these, never 500)."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestError(
            f"JSON decode error: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            err_type=PYDANTIC_ERROR_TYPE,
        ) from None
    except (UnicodeDecodeError, RecursionError):
        raise RequestError(BODY_PARSE_ERROR, err_type=PYDANTIC_ERROR_TYPE) from None


def check_text(text: str) -> None:
    """A prompt text the tokenizer can take: vLLM's tokenizer raises ``UnicodeEncodeError`` on
    a lone surrogate, which vLLM answers as a 400 with the error's own words."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(str(exc)) from None


class VllmBody(BaseModel):
    """vLLM's ``OpenAIBaseModel``: extra fields allowed, lax types."""

    model_config = ConfigDict(extra="allow")


class StreamOptions(VllmBody):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


StopParam = str | list[str] | None
NonNegInt = Annotated[int, Field(ge=0)]


def _range(ok: bool, message: str, param: str, value: Any) -> None:
    if not ok:
        raise FieldError(message, param, value)


class SamplingRequest(VllmBody):
    """The fields /v1/completions and /v1/chat/completions share, with vLLM's checks."""

    model: str | None = None
    n: int = 1
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopParam = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: list[int] | None = None
    logit_bias: dict[str, float] | None = None
    use_beam_search: bool = False
    prompt_logprobs: int | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise FieldError(
                "Stream options can only be defined when `stream=True`.", "stream_options"
            )
        return data

    @model_validator(mode="after")
    def _sampling_ranges(self):
        """``SamplingParams._verify_args``: what vLLM refuses once the body is parsed."""
        _range(self.n >= 1, f"n must be at least 1, got {self.n}.", "n", self.n)
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _range(v is None or -2.0 <= v <= 2.0, f"{name} must be in [-2, 2], got {v}.", name, v)
        v = self.repetition_penalty
        _range(v is None or v > 0.0,
               f"repetition_penalty must be greater than zero, got {v}.", "repetition_penalty", v)  # fmt: skip
        v = self.temperature
        _range(v is None or v >= 0.0, f"temperature must be non-negative, got {v}.", "temperature", v)  # fmt: skip
        v = self.top_p
        _range(v is None or 0.0 < v <= 1.0, f"top_p must be in (0, 1], got {v}.", "top_p", v)
        v = self.top_k
        _range(v is None or v >= -1,
               f"top_k must be 0 (disable), or at least 1, got {v}.", "top_k", v)  # fmt: skip
        v = self.min_p
        _range(v is None or 0.0 <= v <= 1.0, f"min_p must be in [0, 1], got {v}.", "min_p", v)
        _range(self.min_tokens >= 0,
               f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.",
               "min_tokens", self.min_tokens)  # fmt: skip
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def texts(self) -> list[str]:
        """The prompt texts the tokenizer gets (for ``check_text``)."""
        raise NotImplementedError


class CompletionRequest(SamplingRequest):
    prompt: list[NonNegInt] | list[list[NonNegInt]] | str | list[str] | None = None
    max_tokens: int | None = COMPLETIONS_DEFAULT_MAX_TOKENS
    echo: bool | None = False
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True

    @model_validator(mode="before")
    @classmethod
    def _null_max_tokens(cls, data: Any) -> Any:
        """``"max_tokens": null`` means the default (16), as in vLLM."""
        if isinstance(data, dict) and "max_tokens" in data and data["max_tokens"] is None:
            data = {**data, "max_tokens": COMPLETIONS_DEFAULT_MAX_TOKENS}
        return data

    @model_validator(mode="after")
    def _check_prompt(self):
        p = self.prompt
        if p is None or p == "" or (isinstance(p, list) and len(p) == 0):
            raise FieldError(
                "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
            )
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

    def texts(self) -> list[str]:
        return [p for p in self.prompts() if isinstance(p, str)]


class ChatMessage(VllmBody):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _text_parts_have_text(self):
        """A part of type "text" matches only vLLM's text-part types, which need a string
        ``text``; parts of other types are vLLM's business (images, audio, ...)."""
        if isinstance(self.content, list):
            for i, part in enumerate(self.content):
                if part.get("type") == "text" and not isinstance(part.get("text"), str):
                    raise FieldError(
                        f"messages.content.{i}.text: a text part needs a string `text`",
                        f"messages.content.{i}",
                    )
        return self

    def text_parts(self) -> list[str]:
        c = self.content
        if c is None:
            return []
        if isinstance(c, str):
            return [c]
        return [p["text"] for p in c if p.get("type") == "text"]


class ChatCompletionRequest(SamplingRequest):
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
    def _check_template_flags(self):
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        """vLLM's ``max_completion_tokens or max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def texts(self) -> list[str]:
        return [t for m in self.messages for t in m.text_parts()]


def parse(model: type[SamplingRequest], data: Any) -> SamplingRequest:
    """A validated body, or the ``RequestError`` vLLM would answer (pydantic's errors, then the
    tokenizer's refusal of text it cannot encode)."""
    try:
        req = model.model_validate(data)
    except ValidationError as exc:
        raise request_error(exc) from None
    for t in req.texts():
        check_text(t)
    return req
