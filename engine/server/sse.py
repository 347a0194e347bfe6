"""Server-sent events: the two framings the APIs use, and a streaming response that always
cancels its generation when the stream ends early (client gone, server stopping).

Contract: ``data(obj)`` -> ``"data: {json}\\n\\n"`` (OpenAI; ``DONE`` is the terminator);
``event(name, obj)`` -> ``"event: NAME\\ndata: {json}\\n\\n"`` (Anthropic);
``stream(gen, body)`` wraps the async iterator ``body`` of one ``Generation`` in a Starlette
``StreamingResponse``; when ``body`` stops for any reason before the reply finished, the
generation is cancelled (the engine stops within one cycle).
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

DONE = "data: [DONE]\n\n"


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data(obj) -> str:
    return f"data: {_dumps(obj)}\n\n"


def event(name: str, obj) -> str:
    return f"event: {name}\ndata: {_dumps(obj)}\n\n"


def stream(gen, body: AsyncIterator[str], headers: dict[str, str] | None = None) -> StreamingResponse:
    async def guarded() -> AsyncIterator[str]:
        try:
            async for chunk in body:
                yield chunk
        finally:
            gen.close()

    h = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    h.update(headers or {})
    return StreamingResponse(guarded(), media_type="text/event-stream", headers=h)
