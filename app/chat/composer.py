"""The message box: Enter sends, Shift+Enter adds a newline, the button turns into Stop while
a reply streams. Also shows the "editing a message" banner.

Signals: ``send_requested(str)``, ``stop_requested()``, ``edit_cancelled()``.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget


MAX_LINES = 8


class ComposerEdit(QPlainTextEdit):
    submit = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers()
            if not mods & (Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.AltModifier):
                self.submit.emit()
                return
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    edit_cancelled = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._busy = False
        self._can_send = False
        self.editing_msg_id: int | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(16, 4, 16, 12)
        lay.setSpacing(4)
        self.edit_banner = QFrame(self)
        self.edit_banner.setObjectName("undoBar")
        bl = QHBoxLayout(self.edit_banner)
        bl.setContentsMargins(8, 2, 4, 2)
        self.edit_label = QLabel("Editing a message — sending replaces it and every later message.")
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.cancel_edit_button.setAccessibleName("Cancel editing")
        self.cancel_edit_button.clicked.connect(self.cancel_edit)
        bl.addWidget(self.edit_label, 1)
        bl.addWidget(self.cancel_edit_button)
        self.edit_banner.hide()
        lay.addWidget(self.edit_banner)
        row = QHBoxLayout()
        self.edit = ComposerEdit(self)
        self.edit.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.edit.setAccessibleName("Message input")
        self.edit.setTabChangesFocus(True)
        self.edit.submit.connect(self._on_submit)
        self.edit.textChanged.connect(self._sync)
        self.edit.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.button = QPushButton("Send", self)
        self.button.setAccessibleName("Send message")
        self.button.setDefault(False)
        self.button.setAutoDefault(False)
        self.button.clicked.connect(self._on_button)
        self.button.setMinimumWidth(84)
        row.addWidget(self.edit, 1)
        row.addWidget(self.button, 0, Qt.AlignmentFlag.AlignBottom)
        lay.addLayout(row)
        self.hint = QLabel("", self)
        self.hint.setObjectName("muted")
        lay.addWidget(self.hint)
        self._fit()
        self._sync()

    @property
    def text(self) -> str:
        return self.edit.toPlainText()

    def set_state(self, *, busy: bool, can_send: bool, hint: str = "") -> None:
        """``busy``: a reply is streaming here (button = Stop). ``can_send``: a model is ready."""
        self._busy, self._can_send = busy, can_send
        self.hint.setText(hint)
        self.hint.setVisible(bool(hint))
        self._sync()

    def _sync(self) -> None:
        if self._busy:
            self.button.setText("Stop")
            self.button.setAccessibleName("Stop generating")
            self.button.setToolTip("Stop generating (Esc)")
            self.button.setEnabled(True)
        else:
            self.button.setText("Send")
            self.button.setAccessibleName("Send message")
            self.button.setToolTip("Send (Enter)")
            self.button.setEnabled(self._can_send and bool(self.text.strip()))

    def _fit(self, *_args) -> None:
        """Grow with the text up to ``MAX_LINES`` lines, every one of them fully shown: a
        line's height is its block's (the font's line spacing rounded up), plus the document
        margins, the frame and the viewport margins."""
        e = self.edit
        doc = e.document()
        lines = max(1, min(MAX_LINES, int(doc.size().height())))
        line_h = max(e.fontMetrics().lineSpacing(), int(e.blockBoundingRect(doc.firstBlock()).height()))
        m = e.contentsMargins()
        chrome = int(2 * doc.documentMargin()) + 2 * e.frameWidth() + m.top() + m.bottom()
        e.setFixedHeight(lines * line_h + chrome + 4)

    def _on_button(self) -> None:
        if self._busy:
            self.stop_requested.emit()
        else:
            self._on_submit()

    def _on_submit(self) -> None:
        text = self.text.strip()
        if self._busy or not self._can_send or not text:
            return
        self.send_requested.emit(text)

    def clear(self) -> None:
        self.edit.clear()

    def begin_edit(self, msg_id: int, text: str) -> None:
        self.editing_msg_id = msg_id
        self.edit.setPlainText(text)
        self.edit_banner.show()
        self.edit.setFocus()

    def cancel_edit(self) -> None:
        if self.editing_msg_id is None:
            return
        self.editing_msg_id = None
        self.edit_banner.hide()
        self.edit.clear()
        self.edit_cancelled.emit()

    def end_edit(self) -> None:
        self.editing_msg_id = None
        self.edit_banner.hide()
