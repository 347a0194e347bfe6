"""The scrolling column of messages of one conversation.

Sticks to the bottom while a reply streams unless the user scrolled up. Messages are built
once per ``show_conversation``; a streaming reply is updated in place through
``update_message``. Signals are forwarded from the message widgets.
"""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QSizePolicy,
                               QVBoxLayout, QWidget)

from app.chat.markdown import plain_inline
from app.chat.message_widget import MessageWidget
from app.db import Message
from app.tools.result_widget import ToolResultWidget

MAX_COLUMN_WIDTH = 860


class _Canvas(QWidget):
    """The scrolled widget. Its height is its height for the viewport's width: the default
    minimum size hint measures every word-wrapped label at its narrowest, hundreds of pixels
    too tall, which left a blank band under the last message (all one saw after a resize,
    since the view sticks to the bottom)."""

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(super().minimumSizeHint().width(), 0)


class ConversationView(QScrollArea):
    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    branch_requested = Signal(int, int)  # (msg_id, step): show another version
    example_requested = Signal(str)  # an example prompt of the empty state was clicked
    tool_example_requested = Signal(str)  # one that needs the built-in python_doc tool on

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setAccessibleName("Conversation")
        self.conv_id: int | None = None
        self.tint = False
        self.model_name: str | None = None
        self.full_loader = None  # msg_id -> whole text, for messages given as a preview
        self.tool_decider = None  # the ToolLoop (its cards' Allow / Deny), see app.tools
        self.widgets: dict[int, MessageWidget] = {}
        self._rows: dict[int, QWidget] = {}  # what sits in the column for each message
        self._stick = True
        self.highlighted: int | None = None  # the message a search jumped to
        canvas = _Canvas()
        canvas.setObjectName("conversationCanvas")
        outer = QHBoxLayout(canvas)
        outer.setContentsMargins(16, 16, 16, 16)
        self.column = QWidget(canvas)
        self.column.setMaximumWidth(MAX_COLUMN_WIDTH)
        self._col = QVBoxLayout(self.column)
        self._col.setContentsMargins(0, 0, 0, 0)
        self._col.setSpacing(14)
        # The empty state: a hint, and for models that come with them, example prompts.
        self.empty_label = QWidget(self.column)
        empty = QVBoxLayout(self.empty_label)
        empty.setContentsMargins(0, 0, 0, 0)
        self.empty_text = QLabel("Send a message to start the conversation.", self.empty_label)
        self.empty_text.setObjectName("muted")
        self.empty_text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_text.setWordWrap(True)
        empty.addWidget(self.empty_text)
        self._examples = QVBoxLayout()
        self._examples.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        empty.addLayout(self._examples)
        # the examples that need a tool: a note the column's width (it wraps) and their buttons
        self.tool_note = QLabel("", self.empty_label)
        self.tool_note.setObjectName("muted")
        self.tool_note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.tool_note.setWordWrap(True)
        self.tool_note.hide()
        empty.addWidget(self.tool_note)
        self._tool_examples = QVBoxLayout()
        self._tool_examples.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        empty.addLayout(self._tool_examples)
        self.example_buttons: list[QPushButton] = []
        self._example_widgets: list[QWidget] = []
        self._col.addWidget(self.empty_label)
        self._col.addStretch(1)
        outer.addStretch(0)
        outer.addWidget(self.column, 1)
        outer.addStretch(0)
        self.setWidget(canvas)
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range_changed)
        bar.valueChanged.connect(self._on_scrolled)

    def set_examples(self, intro: str, prompts: list[str], tool_prompts: list[str] = (),
                     tool_intro: str = "") -> None:
        """What an empty conversation shows: ``intro`` above clickable ``prompts`` (none: the
        plain hint), then ``tool_intro`` above ``tool_prompts``, which are sent with the
        built-in ``python_doc`` tool switched on for the chat."""
        for w in self._example_widgets:
            w.setParent(None)
            w.deleteLater()
        self.example_buttons, self._example_widgets = [], []
        self.empty_text.setText(intro or "Send a message to start the conversation.")
        for prompt in prompts:
            self._example_button(plain_inline(prompt), "Send this message",
                                 lambda _=False, p=prompt: self.example_requested.emit(p))
        self.tool_note.setText(tool_intro)
        self.tool_note.setVisible(bool(tool_prompts and tool_intro))
        for prompt in tool_prompts:
            self._example_button(
                f"{plain_inline(prompt)}  (with a tool)",
                "Switch on the built-in python_doc tool for this chat and send this message; "
                "the model asks you before the tool runs",
                lambda _=False, p=prompt: self.tool_example_requested.emit(p),
                self._tool_examples)

    def _example_button(self, text: str, tip: str, on_click, layout=None) -> None:
        b = QPushButton(text, self.empty_label)
        b.setCursor(Qt.CursorShape.PointingHandCursor)
        b.setToolTip(tip)
        b.clicked.connect(on_click)
        (layout or self._examples).addWidget(b)
        self.example_buttons.append(b)
        self._example_widgets.append(b)

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick = value >= bar.maximum() - 40

    def _on_range_changed(self, _lo: int, hi: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(hi)

    def show_match(self, msg_id: int) -> None:
        """Scroll to message ``msg_id`` (a search hit) and mark it until the next rebuild."""
        row = self._rows.get(msg_id)
        if row is None:
            return
        self.highlighted = msg_id
        w = self.widgets[msg_id]
        w.setProperty("match", True)
        w.style().unpolish(w)
        w.style().polish(w)
        self._stick = False

        def scroll() -> None:
            if self._rows.get(msg_id) is row:
                self._stick = False
                self.ensureWidgetVisible(row, 0, 40)
        QTimer.singleShot(0, scroll)
        QTimer.singleShot(120, scroll)  # again once the rows' heights have settled

    def scroll_to_bottom(self) -> None:
        self._stick = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def clear(self) -> None:
        for row in self._rows.values():
            self._col.removeWidget(row)
            row.hide()
            row.deleteLater()
        self.widgets.clear()
        self._rows.clear()
        self.highlighted = None
        self.empty_label.show()

    def show_conversation(self, conv_id: int | None, messages: list[Message],
                          live: dict[int, tuple[str, dict]] | None = None, *,
                          branches: dict[int, tuple[int, int]] | None = None,
                          attachments: dict | None = None) -> None:
        """Rebuild for ``messages``; ``live`` maps message ids still streaming to (text, meta),
        ``branches`` message ids with other versions to (index, count), ``attachments``
        message ids to their files."""
        self.setUpdatesEnabled(False)
        try:
            self.clear()
            self.conv_id = conv_id
            for m in messages:
                content, meta = (live or {}).get(m.id, (m.content, m.meta))
                final = m.id not in (live or {})
                w = self.add_message(m.id, m.role, content, meta, final=final,
                                     full_length=m.full_length if final else None)
                w.set_branch(*(branches or {}).get(m.id, (1, 1)))
                w.set_attachments((attachments or {}).get(m.id, ()))
        finally:
            self.setUpdatesEnabled(True)
        self.scroll_to_bottom()

    def add_message(self, msg_id: int, role: str, content: str, meta: dict, *, final: bool,
                    full_length: int | None = None) -> MessageWidget:
        """``full_length``: the whole message's length when ``content`` is only its start."""
        name = meta.get("model") or self.model_name
        if role == "tool":
            w: MessageWidget = ToolResultWidget(msg_id, parent=self.column)
        else:
            w = MessageWidget(msg_id, role, model_name=name, tint=self.tint, parent=self.column)
        w.full_loader = self.full_loader
        w.tool_decider = self.tool_decider
        w.edit_requested.connect(self.edit_requested)
        w.regenerate_requested.connect(self.regenerate_requested)
        w.branch_requested.connect(self.branch_requested)
        w.update_content(content, meta, final=final, full_length=full_length)
        row: QWidget = w
        if role == "user":  # the user's bubble hugs its text on the right, like a messenger
            row = QWidget(self.column)
            hl = QHBoxLayout(row)
            hl.setContentsMargins(0, 0, 0, 0)
            hl.addStretch(1)
            w.setParent(row)
            w.setMaximumWidth(int(MAX_COLUMN_WIDTH * 0.8))
            w.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Preferred)
            hl.addWidget(w)
        self._col.insertWidget(self._col.count() - 1, row)
        self._rows[msg_id] = row
        self.widgets[msg_id] = w
        self.empty_label.hide()
        return w

    def update_message(self, msg_id: int, content: str, meta: dict, *, final: bool) -> None:
        w = self.widgets.get(msg_id)
        if w is not None:
            w.update_content(content, meta, final=final)

    def update_actions(self, *, busy: bool) -> None:
        """Edit/regenerate only when idle; regenerate only on the last reply."""
        ids = list(self.widgets)
        last_assistant = next((i for i in reversed(ids) if self.widgets[i].role == "assistant"), None)
        for i, w in self.widgets.items():
            w.set_actions_enabled(edit=not busy, regenerate=not busy,
                                  regenerate_visible=(i == last_assistant))
