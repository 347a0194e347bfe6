"""A whole long message as plain text: a window with a ``QPlainTextEdit`` (which lays out
megabytes lazily, unlike the rendered bubbles) and Copy / Save… buttons. The chat view shows
only the first ``app.chat.markdown.PREVIEW_CHARS`` of such a message and opens this."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)


def size_text(chars: int) -> str:
    """About how big ``chars`` characters are, for a button ("5.0 MB", "820 KB")."""
    return f"{chars / 1e6:.1f} MB" if chars >= 1e6 else f"{chars / 1e3:.0f} KB"


class FullTextDialog(QDialog):
    """Non-modal; deleted when closed (``objectName`` "fullTextDialog"; tests find it)."""

    def __init__(self, title: str, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fullTextDialog")
        self.setWindowTitle(title)
        self.setAccessibleName(title)
        self.text = text
        lay = QVBoxLayout(self)
        note = QLabel(f"{len(text):,} characters ({size_text(len(text))}), shown as plain text.",
                      self)
        note.setObjectName("muted")
        lay.addWidget(note)
        self.edit = QPlainTextEdit(self)
        self.edit.setReadOnly(True)
        self.edit.setAccessibleName("Full message text")
        self.edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.edit.setPlainText(text)
        lay.addWidget(self.edit, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        copy = QPushButton("Copy All", self)
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.text))
        save = QPushButton("Save…", self)
        save.clicked.connect(self.ask_save)
        buttons.addButton(copy, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(save, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.close)
        lay.addWidget(buttons)
        self.resize(900, 650)

    def ask_save(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save message", "message.txt",
                                              "Text (*.txt *.md);;All files (*)")
        if path:
            self.save(path)

    def save(self, path: str | Path) -> bool:
        try:
            Path(path).write_text(self.text, encoding="utf-8")
        except OSError as exc:
            QMessageBox.warning(self, "Save failed",
                                f"The message could not be saved to {path}: {exc.strerror or exc}.")
            return False
        return True
