"""The MTP head's draft window setting (``RowKVCache.window``), read without importing MLX so
the process entries can check it before anything runs (``engine.cli``, ``app.main``)."""
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
    raw = os.environ.get(WINDOW_ENV, "").strip()
    if not raw:
        return DRAFT_WINDOW
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{WINDOW_ENV} must be a whole number of positions (0: the whole "
                         f"context), not {raw!r}") from None
    if n < 0:
        raise ValueError(f"{WINDOW_ENV} must be 0 or more, not {n}")
    return n or None
