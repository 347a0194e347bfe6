"""The chat window's dialogs, as its controllers ask for them: a warning, a yes/no question, a
line of text, a file to save to. All are parented to the window (tests find the warning there by
its ``objectName`` "errorDialog", and replace ``confirm``)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget


class Dialogs:
    def __init__(self, parent: QWidget) -> None:
        self.parent = parent

    def show_error(self, title: str, text: str) -> QMessageBox:
        """A non-blocking warning dialog (``objectName`` "errorDialog")."""
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok,
                          self.parent)
        box.setObjectName("errorDialog")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box

    def confirm(self, title: str, text: str) -> bool:
        """Ask yes/no (tests replace this)."""
        answer = QMessageBox.question(self.parent, title, text)
        return answer == QMessageBox.StandardButton.Yes

    def ask_text(self, title: str, label: str, text: str = "") -> str | None:
        """A line of text, or None when cancelled."""
        answer, ok = QInputDialog.getText(self.parent, title, label, text=text)
        return answer if ok else None

    def ask_save_path(self, caption: str, start: str, filters: str) -> str:
        """A file to save to ("" when cancelled)."""
        path, _ = QFileDialog.getSaveFileName(self.parent, caption, start, filters)
        return path
