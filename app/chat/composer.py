"""The message box: Enter sends, Shift+Enter adds a newline, the button turns into Stop while
a reply streams. Also shows the "editing a message" banner.

Files can be attached (the Attach button, or dropped on the composer): they show as removable
chips above the message box and go with the next message (``attachments``). Images (issue 32)
come the same ways and by pasting (a clipboard image, or copied image files); they show as
thumbnails (click one to remove it). An image is refused at once, in one line under the
message box (``attach_error``), when the model cannot read images (``set_vision``) or the file
cannot be used; the text and the other attachments stay.

Signals: ``send_requested(str)``, ``stop_requested()``, ``edit_cancelled()``,
``attachments_changed()``, ``attach_failed(str message)``.
"""
from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QImage, QKeyEvent
from PySide6.QtWidgets import (QFileDialog, QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton,
                               QToolButton, QVBoxLayout, QWidget)

from app.chat.attachments import (FILE_FILTER, AttachmentError, estimate_tokens,
                                  read_attachment)
from app.chat.image_view import THUMB, ImageThumb, png_bytes
from app.chat.images import (IMAGE_FILTER, PASTED_NAME, describe, image_attachment,
                             images_of, is_image_path, no_vision_message, read_image)
from app.db import Attachment
from engine.vision.image_io import DEFAULT_LIMITS


MAX_LINES = 8


class ComposerEdit(QPlainTextEdit):
    """Signals: ``submit()``; ``files_pasted(list[str])`` and ``image_pasted(QImage)`` for a
    paste of copied files or of an image (text is pasted as usual)."""

    submit = Signal()
    files_pasted = Signal(list)
    image_pasted = Signal(QImage)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 - Qt override
        return source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 - Qt override
        files = [u.toLocalFile() for u in source.urls() if u.isLocalFile()]
        if files:
            self.files_pasted.emit(files)
        elif source.hasImage() and not source.text().strip():
            # (a spreadsheet's cells come as text and a picture of them: the text wins)
            self.image_pasted.emit(QImage(source.imageData()))
        else:
            super().insertFromMimeData(source)

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
    attachments_changed = Signal()
    attach_failed = Signal(str)
    thinking_toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._busy = False
        self._can_send = False
        self.editing_msg_id: int | None = None
        self.attachments: list[Attachment] = []
        self._chips: list[QToolButton] = []
        self.vision = False
        self.model_name: str | None = None
        self.setAcceptDrops(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(16, 4, 16, 12)
        lay.setSpacing(4)
        self.edit_banner = QFrame(self)
        self.edit_banner.setObjectName("undoBar")
        bl = QHBoxLayout(self.edit_banner)
        bl.setContentsMargins(8, 2, 4, 2)
        self.edit_label = QLabel("Editing a message — sending starts a new branch from here; the original stays, "
                                 "reachable with the ‹ › arrows.")
        self.edit_label.setWordWrap(True)
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.cancel_edit_button.setAccessibleName("Cancel editing")
        self.cancel_edit_button.clicked.connect(self.cancel_edit)
        bl.addWidget(self.edit_label, 1)
        bl.addWidget(self.cancel_edit_button)
        self.edit_banner.hide()
        lay.addWidget(self.edit_banner)
        self.chip_row = QHBoxLayout()
        self.chip_row.setSpacing(4)
        self.chip_row.setContentsMargins(0, 0, 0, 0)
        self.attach_button = QToolButton(self)
        self.attach_button.setText("Attach…")
        self.attach_button.setObjectName("composerToggle")
        self.attach_button.setAccessibleName("Attach files")
        self.attach_button.setToolTip("Attach images, text, code, Markdown or PDF files (or drop "
                                      "them here; paste images)")
        self.attach_button.clicked.connect(self.ask_files)
        self.chip_row.addWidget(self.attach_button)
        self.think_button = QToolButton(self)
        self.think_button.setText("Think")
        self.think_button.setObjectName("composerToggle")  # its checked state: theme.py
        self.think_button.setCheckable(True)
        self.think_button.setAccessibleName("Thinking")
        self.think_button.setToolTip("Let the model think before it answers (this chat)")
        self.think_button.toggled.connect(self.thinking_toggled)
        self.chip_row.addWidget(self.think_button)
        self.chip_row.addStretch(1)
        lay.addLayout(self.chip_row)
        lay.addLayout(self._input_row())
        self._add_notes(lay)
        self._fit()
        self._sync()

    def _add_notes(self, lay: QVBoxLayout) -> None:
        """The lines under the message box: a hint, the context warning, an attach error."""
        self.hint = QLabel("", self)
        self.hint.setObjectName("muted")
        lay.addWidget(self.hint)
        self.warning = QLabel("", self)
        self.warning.setObjectName("errorText")
        self.warning.setWordWrap(True)
        self.warning.setAccessibleName("Context warning")
        self.warning.hide()
        lay.addWidget(self.warning)
        self.attach_error = QLabel("", self)
        self.attach_error.setObjectName("errorText")
        self.attach_error.setAccessibleName("Attachment error")
        self.attach_error.setWordWrap(True)  # one sentence, wrapped in a narrow window
        self.attach_error.hide()
        lay.addWidget(self.attach_error)

    def _input_row(self) -> QHBoxLayout:
        """The message box, and Send/Stop on its right."""
        row = QHBoxLayout()
        self.edit = ComposerEdit(self)
        self.edit.setObjectName("textInput")  # a visible border in both themes: theme.py
        self.edit.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.edit.setAccessibleName("Message input")
        self.edit.setTabChangesFocus(True)
        self.edit.submit.connect(self._on_submit)
        self.edit.files_pasted.connect(self.attach_paths)
        self.edit.image_pasted.connect(self.attach_qimage)
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
        return row

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
        line's height is one line of its block's (the font's line spacing rounded up; a long
        paragraph is one block of many wrapped lines), plus the document margins, the frame
        and the viewport margins."""
        e = self.edit
        doc = e.document()
        lines = max(1, min(MAX_LINES, int(doc.size().height())))
        first = doc.firstBlock()
        wrapped = max(1, first.layout().lineCount()) if first.layout() is not None else 1
        line_h = max(e.fontMetrics().lineSpacing(),
                     int(e.blockBoundingRect(first).height() / wrapped))
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
        self.show_attach_error("")
        self.set_attachments([])

    # -- attachments --------------------------------------------------------------------------
    def ask_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files", "",
                                                f"{IMAGE_FILTER};;{FILE_FILTER}")
        self.attach_paths(paths)

    def set_vision(self, vision: bool, model_name: str | None) -> None:
        """Whether the loaded model reads images (images attached before stay: they are
        refused when sent, with the same line, if the model changed)."""
        self.vision, self.model_name = vision, model_name

    def attach_paths(self, paths) -> None:
        """Read and attach ``paths``; a file that cannot be attached is reported, the rest kept."""
        added = list(self.attachments)
        errors = []
        for path in paths:
            try:
                added.append(self._read(str(path), added))
            except AttachmentError as exc:
                errors.append(str(exc))
        self._attached(added, errors)

    def _read(self, path: str, added: list[Attachment]) -> Attachment:
        if not is_image_path(path):
            return read_attachment(path)
        self._check_image(added)
        return read_image(path)

    def _check_image(self, added: list[Attachment]) -> None:
        """Refuse one more image: the model cannot read them, or the message has its most."""
        if not self.vision:
            raise AttachmentError(no_vision_message(self.model_name))
        if len(images_of(added)) >= DEFAULT_LIMITS.max_images:
            raise AttachmentError(f"A message can carry at most {DEFAULT_LIMITS.max_images} "
                                  "images; send these first.")

    def attach_image(self, name: str, data: bytes) -> None:
        """Attach image file bytes (pasted or dropped without a file)."""
        try:
            self._check_image(self.attachments)
            added = [*self.attachments, image_attachment(name, data)]
        except AttachmentError as exc:
            self._attached(self.attachments, [str(exc)])
            return
        self._attached(added, [])

    def attach_qimage(self, image: QImage) -> None:
        if image.isNull():
            self._attached(self.attachments, ["The clipboard image could not be read."])
            return
        self.attach_image(PASTED_NAME, png_bytes(image))

    def _attached(self, files: list[Attachment], errors: list[str]) -> None:
        errors = list(dict.fromkeys(errors))  # three images refused for one reason: one line
        self.show_attach_error("; ".join(errors))
        for text in errors:
            self.attach_failed.emit(text)
        if files != self.attachments:
            self.set_attachments(files)

    def show_attach_error(self, text: str) -> None:
        """One line under the message box (empty hides it); the full text is its tooltip."""
        line = " ".join(text.split())
        self.attach_error.setToolTip(line)
        self.attach_error.setText(line if len(line) <= 160 else line[:159] + "…")
        self.attach_error.setVisible(bool(line))

    def set_attachments(self, files: list[Attachment]) -> None:
        self.attachments = list(files)
        for chip in self._chips:
            self.chip_row.removeWidget(chip)
            chip.hide()
            chip.deleteLater()
        self._chips = []
        for i, a in enumerate(self.attachments):
            chip = self._chip(a)
            chip.clicked.connect(lambda _=False, k=i: self.remove_attachment(k))
            self.chip_row.insertWidget(2 + i, chip)  # after Attach and Think
            self._chips.append(chip)
        self.attachments_changed.emit()

    def _chip(self, a: Attachment) -> QToolButton:
        if a.kind == "image":
            chip: QToolButton = ImageThumb(a, THUMB, text="✕", parent=self)
            chip.setToolTip(f"{describe(a)}. Click to remove.")
        else:
            chip = QToolButton(self)
            chip.setObjectName("chipButton")
            chip.setText(f"{a.name}  ✕")
            chip.setToolTip(f"{a.name}: about {estimate_tokens(a.content):,} tokens. "
                            "Click to remove.")
        chip.setAccessibleName(f"Remove attachment {a.name}")
        return chip

    def remove_attachment(self, index: int) -> None:
        files = list(self.attachments)
        if 0 <= index < len(files):
            del files[index]
            self.set_attachments(files)

    def set_thinking(self, on: bool, *, available: bool) -> None:
        """This chat's thinking switch (disabled when the model's template has none)."""
        self.think_button.blockSignals(True)
        self.think_button.setChecked(on and available)
        self.think_button.blockSignals(False)
        self.think_button.setEnabled(available)
        self.think_button.setToolTip(
            "Let the model think before it answers (this chat)" if available
            else "This model's chat template has no thinking switch")

    def set_warning(self, text: str) -> None:
        """A warning under the message box (the context would overflow); empty hides it."""
        self.warning.setText(text)
        self.warning.setVisible(bool(text))

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        mime = event.mimeData()
        if (mime.hasUrls() or mime.hasImage()) and not self._busy:
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt override
        mime = event.mimeData()
        paths = [u.toLocalFile() for u in mime.urls() if u.isLocalFile()]
        if paths:
            self.attach_paths(paths)
            event.acceptProposedAction()
        elif mime.hasImage():
            self.attach_qimage(QImage(mime.imageData()))
            event.acceptProposedAction()

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
