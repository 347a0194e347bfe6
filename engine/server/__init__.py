"""The local OpenAI- and Anthropic-compatible server (issue 14): an adapter from HTTP to the
engine, with no Qt.

Layout: ``guard`` / ``connections`` (the perimeter: content types, Origin, Host, body sizes,
idle and stalled sockets), ``templates`` (messages/tools -> prompt ids through the model's chat
template), ``toolcalls`` / ``reasoning`` / ``reply_parts`` (the model's text -> tool calls,
thinking and content, streaming and not), ``openai_api`` / ``anthropic_api`` (the wire
formats), ``app`` (Starlette routes, API key, errors), ``runner`` (``Server`` /
``start_server`` on uvicorn). Requests are decoded by the engine core's scheduler
(``engine.core.scheduler``), the same one the app's chat uses; ``engine.bench.server_load``
measures the server against in-process decoding. ``python -m engine serve`` is the CLI.

Importing this package is cheap; ``Server``, ``start_server`` and ``Scheduler`` load on use.
"""
from __future__ import annotations

__all__ = ["GenRequest", "Scheduler", "Server", "start_server"]


def __getattr__(name: str):
    if name in ("Server", "start_server"):
        from engine.server import runner

        return getattr(runner, name)
    if name in ("Scheduler", "GenRequest"):
        from engine.core import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module 'engine.server' has no attribute {name!r}")
