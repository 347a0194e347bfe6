"""One helper for the chat widgets' box layouts."""
from __future__ import annotations

from typing import TypeVar

from PySide6.QtWidgets import QBoxLayout, QWidget

B = TypeVar("B", bound=QBoxLayout)


def box_layout(kind: type[B], parent: QWidget | None = None, *,
               margins: tuple[int, int, int, int] = (0, 0, 0, 0), spacing: int = -1) -> B:
    """A ``QHBoxLayout`` or ``QVBoxLayout`` (``kind``) on ``parent`` (None: to be nested) with
    these content margins (left, top, right, bottom) and spacing (-1: the style's)."""
    lay = kind(parent) if parent is not None else kind()
    lay.setContentsMargins(*margins)
    if spacing >= 0:
        lay.setSpacing(spacing)
    return lay
