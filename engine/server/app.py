"""The ASGI app (Starlette): routes of both APIs, API-key checks and error rendering.

Contract: ``build_app(backend, perimeter=...)`` returns a Starlette app serving ``backend``
(see ``engine.server.common.Backend``). Every request first passes the perimeter
(``engine.server.guard``: Host, Origin/CORS, ``application/json`` bodies, body size), then
the API-key check. With ``backend.api_key`` set, every request must carry
it as ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (401 otherwise). Errors render in
the shape of the API the path belongs to: Anthropic's for ``/v1/messages…``, OpenAI's for
everything else. An unexpected exception is a 500 and the server keeps serving.
"""
from __future__ import annotations

import hmac
import logging
from collections import Counter

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.server import anthropic_api, openai_api, responses_api
from engine.server.common import Backend
from engine.server.errors import ApiError
from engine.server.guard import Perimeter, PerimeterMiddleware

log = logging.getLogger(__name__)


def _is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(path: str, err: ApiError) -> JSONResponse:
    body = err.anthropic_body() if _is_anthropic(path) else err.openai_body()
    return JSONResponse(body, status_code=err.status, headers=err.headers)


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(request.url.path, exc)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return error_response(request.url.path, ApiError(exc.status_code, str(exc.detail)))


async def _on_crash(request: Request, exc: Exception) -> JSONResponse:
    log.exception("request %s failed", request.url.path)
    return error_response(request.url.path,
                          ApiError(500, f"Internal server error: {type(exc).__name__}: {exc}"))


class ApiKeyMiddleware:
    """Refuses (401) any HTTP request without the server's key."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        err = ApiError(401, "Missing or wrong API key: send it as 'Authorization: Bearer KEY' "
                            "or 'x-api-key: KEY'.", code="invalid_api_key")
        await error_response(scope.get("path", ""), err)(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        return hmac.compare_digest(given, self.key)


async def health(request: Request) -> JSONResponse:
    backend: Backend = request.app.state.backend
    refused = request.app.state.refused
    return JSONResponse({"status": "ok", "model": backend.model_id,
                         "busy": backend.scheduler.busy,
                         "completed": backend.scheduler.completed,
                         **backend.scheduler.status(),
                         "refused": {str(k): v for k, v in sorted(refused.items())}})


def build_app(backend: Backend, perimeter: Perimeter | None = None,
              responses: responses_api.ResponseStore | None = None) -> Starlette:
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", openai_api.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", openai_api.get_model, methods=["GET"]),
        Route("/v1/chat/completions", openai_api.chat_completions, methods=["POST"]),
        Route("/v1/completions", openai_api.completions, methods=["POST"]),
        Route("/v1/responses", responses_api.create, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses_api.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses_api.delete, methods=["DELETE"]),
        Route("/v1/messages", anthropic_api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic_api.count_tokens, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={
        ApiError: _on_api_error, HTTPException: _on_http_error, Exception: _on_crash})
    app.state.backend = backend
    # finished Responses-API responses, for previous_response_id (bounded in count and time)
    app.state.responses = responses or responses_api.ResponseStore()
    if backend.api_key:
        app.add_middleware(ApiKeyMiddleware, key=backend.api_key)
    # added last, so it runs first: preflights and refusals need no key
    app.state.refused = Counter()  # refusals of the perimeter by status, shown by /health
    app.add_middleware(PerimeterMiddleware, perimeter=perimeter or Perimeter(),
                       refused=app.state.refused)
    return app
