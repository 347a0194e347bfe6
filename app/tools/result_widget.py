"""A ``tool`` message in the conversation: a ``MessageWidget`` whose body is a collapsible
``ToolResultBox`` (the tool, its state and time on one line; the result inside)."""
from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.chat.message_widget import MessageWidget
from app.tools.cards import ToolResultBox


class ToolResultWidget(MessageWidget):
    def __init__(self, msg_id: int, *, parent: QWidget | None = None) -> None:
        super().__init__(msg_id, "tool", parent=parent)
        self.setObjectName("toolMessage")
        self.role_label.hide()
        self.body.hide()
        self.box = ToolResultBox(self)
        self.layout().insertWidget(1, self.box)
        self.setAccessibleName("Tool result")

    def update_content(self, content: str, meta: dict, *, final: bool,
                       full_length: int | None = None) -> None:
        self.content = content
        self.full_length = max(len(content), full_length or 0)
        self.box.set_result(content, meta)
        self.stats_label.hide()
        self.copy_button.setVisible(True)
