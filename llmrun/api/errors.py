"""Errors in the OpenAI API's own shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

from llmrun.api.flags import FLAGS
from llmrun.api.limits import OverLimit
from llmrun.errors import LlmrunError, word

# what a client sets in its request body; everything else is the operator's, set when the server started
REQUEST_FIELDS = frozenset(
    {
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repeat_penalty",
        "repetition_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "max_tokens",
        "stop",
        "logprobs",
        "prompt",
        "messages",
        "response_format",
        "tools",
    }
)
WORDS = {
    **{name: f"the server's {flag}" for name, flag in FLAGS.items()},
    **{name: name for name in REQUEST_FIELDS},
    "raw": "/v1/completions",  # a prompt sent there is not put through the chat template
    "debug": "the server log",
    "schema": "response_format.json_schema.schema",
    "grammar": "the grammar",
}


def worded(text: str) -> str:
    """Core text (which names parameters as `n_ctx`) in the server's words."""
    return word(text, WORDS)


def explain(exc: LlmrunError) -> str:
    """An engine error as one message for a client: what is wrong; what to do."""
    message, hint = exc.worded(WORDS)
    return f"{message}; {hint}" if hint else message


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _KINDS.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


_KINDS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


def bad_field(param: str, message: str, code: str = "invalid_value") -> ApiError:
    """A 400 for one field of the request."""
    return ApiError(400, message, param=param, code=code)


def over_limit(exc: OverLimit) -> ApiError:
    """A request past one of :mod:`llmrun.api.limits`: 413 for too much text, else a 400 naming the field."""
    return ApiError(
        exc.status, exc.message, param=exc.field, code="request_too_large" if exc.status == 413 else "invalid_value"
    )
