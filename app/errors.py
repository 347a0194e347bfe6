"""The one place an exception becomes a message for a person (the worker's ``failed`` and
``load_failed``, the model manager's downloads and checks all go through ``describe``)."""
from __future__ import annotations

from engine.errors import EngineError
from engine.hub.client import TOKEN_HELP

__all__ = ["describe"]

# The engine's help for a gated or private repo names the command line (`hf auth login`);
# in the app the token is added in the app itself.
APP_TOKEN_HELP = ("add your Hugging Face token with “Hugging Face token…” in the model "
                  "manager's “Add from Hugging Face” tab, and accept the model's licence on its "
                  "Hugging Face page")


def describe(exc: BaseException) -> str:
    """``EngineError`` messages verbatim (they are written for people; the command-line help
    for a token becomes the app's own); anything else is an
    internal error named with its type, so a bug report says what broke."""
    if isinstance(exc, EngineError):
        return (str(exc) or type(exc).__name__).replace(TOKEN_HELP, APP_TOKEN_HELP)
    if isinstance(exc, MemoryError):
        return "Out of memory: the model or the conversation does not fit in memory."
    return f"Internal error: {type(exc).__name__}: {exc}"
