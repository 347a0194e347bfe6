"""Helpers for the chat widgets: box layouts, shortcut names in the platform's own words."""
from __future__ import annotations

from typing import TypeVar

from PySide6.QtGui import QKeySequence
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


def native_shortcut(key: QKeySequence.StandardKey | str) -> str:
    """How this platform writes a shortcut ("Ctrl+F" here, "⌘F" on a Mac)."""
    return QKeySequence(key).toString(QKeySequence.SequenceFormat.NativeText)
