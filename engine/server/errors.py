"""HTTP errors of the server, rendered in each API's own JSON shape.

Contract: handlers raise ``ApiError(status, message, ...)``; the app renders it as
``{"error": {"message", "type", "param", "code"}}`` on OpenAI routes and as
``{"type": "error", "error": {"type", "message"}}`` on Anthropic routes (``/v1/messages``).
``from_engine_error`` maps the engine's exceptions: a prompt longer than the context and bad
generation parameters are the client's fault (400); anything else is a 500, after which the
server keeps serving.
"""
from __future__ import annotations

from engine.errors import ClusterError, EngineError, GenerationError, PromptTooLongError

# HTTP status -> (OpenAI error type, Anthropic error type)
_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("not_found_error", "not_found_error"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    503: ("server_error", "overloaded_error"),
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def openai_body(self) -> dict:
        kind = _TYPES.get(self.status, ("server_error", "api_error"))[0]
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code}}

    def anthropic_body(self) -> dict:
        kind = _TYPES.get(self.status, ("server_error", "api_error"))[1]
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value" if param else None)


def from_engine_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, PromptTooLongError):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, GenerationError):
        return ApiError(400, str(exc))
    if isinstance(exc, ClusterError):
        return ApiError(503, str(exc), code="cluster_failed")
    if isinstance(exc, EngineError):
        return ApiError(500, f"The engine failed: {exc}")
    return ApiError(500, f"The engine failed: {type(exc).__name__}: {exc}")
