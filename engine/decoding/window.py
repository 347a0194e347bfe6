"""The MTP head's draft settings, read without importing MLX so the process entries can check
them before anything runs (``engine.cli``, ``app.main``): the draft window
(``RowKVCache.window``) and the draft vocabulary (``engine.decoding.draft_vocab``)."""
from __future__ import annotations

import os

DRAFT_WINDOW = 4096
WINDOW_ENV = "MTPCHAT_DRAFT_WINDOW"


def draft_window() -> int | None:
    """How many positions back the MTP head's draft steps attend (``RowKVCache.window``):
    ``$MTPCHAT_DRAFT_WINDOW`` (0: the whole context), else ``DRAFT_WINDOW``.

    A draft step is one query row over the whole context, so at 16k tokens the demo's three
    steps cost half what its four-row verify does (docs/benchmarks.md). A draft
    only proposes: what the verify keeps is exact whatever the head saw, so the window trades
    nothing but acceptance far back, and each row's window is its own (a row drafts the same
    alone as in any batch). A window longer than the context changes nothing. ValueError
    (one line) for a value that is not a whole number >= 0."""
    n = _whole_number(WINDOW_ENV, "positions (0: the whole context)")
    if n is None:
        return DRAFT_WINDOW
    return n or None


def _whole_number(env: str, what: str) -> int | None:
    """``$env`` as a whole number >= 0, None when unset or blank; ValueError (one line,
    naming ``what`` it counts) otherwise."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{env} must be a whole number of {what}, not {raw!r}") from None
    if n < 0:
        raise ValueError(f"{env} must be 0 or more, not {n}")
    return n


# Drafting over part of the vocabulary (``engine.decoding.draft_vocab``).
DRAFT_VOCAB = 32768          # tokens a draft step scores when the setting is automatic
DRAFT_VOCAB_FROM = 65536     # ... and the LM head has at least this many rows
DRAFT_VOCAB_ENV = "MTPCHAT_DRAFT_VOCAB"


def draft_vocab_setting() -> int | None:
    """How many tokens the MTP head's draft steps score: ``$MTPCHAT_DRAFT_VOCAB`` (0: the
    whole vocabulary; N: N tokens), else None (automatic: ``DRAFT_VOCAB`` tokens for an LM
    head of ``DRAFT_VOCAB_FROM`` rows or more, the whole vocabulary below). ValueError (one
    line) for a value that is not a whole number >= 0."""
    return _whole_number(DRAFT_VOCAB_ENV, "tokens (0: the whole vocabulary)")


def check_draft_settings() -> None:
    """Both draft settings read once (ValueError, one line, for a bad one): what the process
    entries call before anything decodes."""
    draft_window()
    draft_vocab_setting()
