"""Server-sent events: the two framings the APIs use, and a streaming response that always
cancels its generation when the stream ends early (client gone, server stopping).

Contract: ``data(obj)`` -> ``"data: {json}\\n\\n"`` (OpenAI; ``DONE`` is the terminator);
``event(name, obj)`` -> ``"event: NAME\\ndata: {json}\\n\\n"`` (Anthropic);
``stream(gen, body, error=...)`` wraps the async iterator ``body`` of one ``Generation`` in a
Starlette ``StreamingResponse``; when ``body`` stops for any reason before the reply finished,
the generation is cancelled (the engine stops within one cycle). An ``ApiError`` raised
mid-stream (the grammar failed, the server cancelled the reply, the engine failed) becomes
one last frame, ``error(exc)`` (``openai_error`` / ``anthropic_error``), and the stream ends
there, without the frames of a finished reply; anything else is logged and sent as a 500.
"""
from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse

from engine.server.errors import ApiError

log = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data(obj) -> str:
    return f"data: {_dumps(obj)}\n\n"


def event(name: str, obj) -> str:
    return f"event: {name}\ndata: {_dumps(obj)}\n\n"


def openai_error(err: ApiError) -> str:
    """OpenAI's mid-stream failure: a ``data: {"error": ...}`` chunk (the client raises it)."""
    return data(err.openai_body())


def anthropic_error(err: ApiError) -> str:
    return event("error", err.anthropic_body())


def stream(gen, body: AsyncIterator[str], headers: dict[str, str] | None = None, *,
           error: Callable[[ApiError], str] = openai_error) -> StreamingResponse:
    async def guarded() -> AsyncIterator[str]:
        try:
            async for chunk in body:
                yield chunk
        except ApiError as err:
            yield error(err)
        except Exception as exc:  # noqa: BLE001 - a bug must still end the stream readably
            log.exception("stream of request %s failed", gen.req.id)
            yield error(ApiError(500, f"Internal server error: {type(exc).__name__}: {exc}"))
        finally:
            gen.close()

    h = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    h.update(headers or {})
    return StreamingResponse(guarded(), media_type="text/event-stream", headers=h)
