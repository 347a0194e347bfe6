"""Sizes as the model manager shows them: decimal GB/MB/KB, as macOS Finder does."""
from __future__ import annotations


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def fmt_gib(n: float) -> str:
    """Memory sizes, in the same decimal GB as every other size in the window (as Finder)."""
    return f"{n / 1e9:.1f} GB"
