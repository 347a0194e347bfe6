"""A one-line label that never widens its layout (the dashboard's card titles and header, the
chat's stats line): ``set_texts(full, *shorter)`` shows the longest of them that fits, and only
the shortest ends in an ellipsis if none does. ``text()`` stays the full text."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """A one-line label that never widens its layout. ``set_texts(full, *shorter)``: it shows
    the longest of them that fits, and only the shortest ends in an ellipsis if none does."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.shorter: tuple[str, ...] = ()
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt name)
        self.shorter = ()
        super().setText(text)

    def set_texts(self, full: str, *shorter: str) -> None:
        super().setText(full)
        self.shorter = shorter
        self.update()

    def shown_text(self) -> str:
        """What is painted at the current width."""
        fm, width = self.fontMetrics(), self.contentsRect().width()
        for text in (self.text(), *self.shorter):
            if fm.horizontalAdvance(text) <= width:
                return text
        last = self.shorter[-1] if self.shorter else self.text()
        return fm.elidedText(last, Qt.TextElideMode.ElideRight, width)

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt name)
        p = QPainter(self)
        p.setPen(self.palette().color(self.foregroundRole()))
        p.drawText(self.contentsRect(), int(self.alignment()), self.shown_text())
