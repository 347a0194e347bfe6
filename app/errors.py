"""The one place an exception becomes a message for a person (the worker's ``failed`` and
``load_failed``, the model manager's downloads and checks all go through ``describe``)."""
from __future__ import annotations

from engine.errors import EngineError

__all__ = ["describe"]


def describe(exc: BaseException) -> str:
    """``EngineError`` messages verbatim (they are written for people); anything else is an
    internal error named with its type, so a bug report says what broke."""
    if isinstance(exc, EngineError):
        return str(exc) or type(exc).__name__
    if isinstance(exc, MemoryError):
        return "Out of memory: the model or the conversation does not fit in memory."
    return f"Internal error: {type(exc).__name__}: {exc}"
