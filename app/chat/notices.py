"""What the chat window says without interrupting: message lines above the conversation (the
model's, the chat storage's), the status bar's dismissable line naming chats with damaged values,
and the dialog saying where a recovered chat database was kept."""
from __future__ import annotations

import logging

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMessageBox, QToolButton, QWidget

from app.chat.layout import box_layout
from app.db import StoreNotice

log = logging.getLogger(__name__)


def message_label(parent: QWidget, accessible_name: str) -> QLabel:
    """A selectable, wrapping error-coloured line, hidden until it has text (``show_text``)."""
    label = QLabel("", parent)
    label.setObjectName("errorText")
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setAccessibleName(accessible_name)
    label.hide()
    return label


def show_text(label: QLabel, text: str) -> None:
    """``label`` says ``text`` (empty hides it)."""
    label.setText(text)
    label.setVisible(bool(text))


class DataNotice(QWidget):
    """A lasting, dismissable line naming chats with damaged values (``add`` one), the first one
    shown, every one in its tooltip."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        hl = box_layout(QHBoxLayout, self, spacing=2)
        self.label = QLabel("", self)
        self.label.setObjectName("errorText")
        self.label.setAccessibleName("Damaged chat data")
        close = QToolButton(self)
        close.setObjectName("msgAction")
        close.setText("×")
        close.setAccessibleName("Dismiss the damaged chat data notice")
        close.clicked.connect(self.hide)
        hl.addWidget(self.label)
        hl.addWidget(close)
        self.texts: list[str] = []
        self.hide()

    def add(self, text: str) -> None:
        self.texts.append(text)
        more = len(self.texts) - 1
        line = self.texts[0] + (f" (and {more} more)" if more else "")
        fm = self.label.fontMetrics()
        self.label.setText(fm.elidedText(line, Qt.TextElideMode.ElideMiddle, 640))
        self.label.setToolTip("\n".join(self.texts) + "\n\nDetails are in the log.")
        self.show()


def show_store_notice(parent: QWidget, banner: QLabel, notice: StoreNotice | None) -> None:
    """A damaged or unwritable chat database: a lasting banner, and for a recovery a dialog
    saying where the old file was kept (non-blocking: the app stays usable)."""
    if notice is None:
        return
    log.warning("chat database: %s", notice.message)
    show_text(banner, notice.message)
    if notice.kind == "recovered":
        box = QMessageBox(QMessageBox.Icon.Warning, "Chat history recovered", notice.message,
                          QMessageBox.StandardButton.Ok, parent)
        box.setObjectName("storeNoticeDialog")
        QTimer.singleShot(0, box.open)
