"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json

from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class GatewayError(Exception):
    """A request the gateway answers itself, with an OpenAI-shaped error body."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        retry_after: float | None = None,
        vllm_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        """The reason, in metrics and (except for vLLM's own errors) in the body."""
        self.param = param
        self.retry_after = retry_after
        self.vllm_type = vllm_type
        """Set for a refusal that mirrors vLLM's: its body then says what vLLM says (its
        type, and the status as code)."""

    @property
    def err_type(self) -> str:
        if self.vllm_type is not None:
            return self.vllm_type
        return _TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status if self.vllm_type is not None else self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        h = dict(headers or {})
        if self.retry_after is not None:
            h["Retry-After"] = str(max(1, round(self.retry_after + 0.499)))
        return web.json_response(self.body(), status=self.status, headers=h)

    def sse_event(self) -> bytes:
        """The error as a final SSE event (for a stream already started)."""
        return f"data: {json.dumps(self.body())}\n\n".encode()
