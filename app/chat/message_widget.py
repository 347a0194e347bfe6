"""One message on screen: a user bubble, or an assistant reply (think card, Markdown, stats).

``MessageWidget.update_content`` may be called repeatedly while a reply streams; the think
card and the Markdown flow below it update incrementally (see ``app.chat.flow``). A message
longer than ``PREVIEW_CHARS`` shows its first part and a "Show full message (X MB)" button
that opens the whole text in a plain-text window (``app.chat.full_text``).
Signals: ``edit_requested(msg_id)``, ``regenerate_requested(msg_id)``, ``copied(str)``.
"""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.chat.flow import MarkdownFlow
from app.chat.full_text import FullTextDialog, size_text
from app.chat.image_view import MESSAGE_THUMB, ImageThumb, ImageViewer
from app.chat.images import describe
from engine.vision.image_io import ImageError
from app.chat.markdown import PREVIEW_CHARS, preview_cut, split_think
from app.chat.stats_line import format_stats, shorter_stats, stats_tooltip
from app.elided_label import ElidedLabel
from app.tools.cards import ToolCallsPanel
from app.tools.history import visible_answer


class ThinkCard(QFrame):
    """The model's reasoning: "Thinking…" while it streams, then a collapsed "Thought for N s"."""

    def __init__(self, parent: QWidget | None = None, *, tint: bool = False) -> None:
        super().__init__(parent)
        self.setObjectName("thinkCard")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 4, 10, 6)
        lay.setSpacing(4)
        self.toggle = QToolButton(self)
        self.toggle.setObjectName("msgAction")
        self.toggle.setCheckable(True)
        self.toggle.setChecked(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow)
        self.toggle.setText("Thinking…")
        self.toggle.setAccessibleName("Show or hide the model's reasoning")
        self.toggle.toggled.connect(self._on_toggled)
        self.toggle.clicked.connect(self._on_user_click)  # clicked: user actions only
        lay.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.flow = MarkdownFlow(self, tint=tint)
        self.flow.setAccessibleName("Reasoning")
        lay.addWidget(self.flow)
        self._user_toggled = False
        self._done = False

    def _on_toggled(self, on: bool) -> None:
        self.flow.setVisible(on)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)

    def _on_user_click(self) -> None:
        self._user_toggled = True  # from now on the card stays as the user left it

    def update_think(self, text: str, *, done: bool, seconds: float | None, final: bool,
                     spans: list | None, base: int) -> None:
        self.flow.set_text(text.strip("\n"), final=final or done, spans=spans, base=base)
        if done and not self._done:
            self._done = True
            self.toggle.setText(f"Thought for {seconds:.0f} s" if seconds is not None else "Thoughts")
            if not self._user_toggled:
                self.toggle.setChecked(False)
        elif not done and final:
            self.toggle.setText("Thoughts (unfinished)")


def _action(parent: QWidget, text: str, name: str, tip: str) -> QToolButton:
    b = QToolButton(parent)
    b.setObjectName("msgAction")
    b.setText(text)
    b.setAccessibleName(name)
    b.setToolTip(tip)
    b.setCursor(Qt.CursorShape.PointingHandCursor)
    return b


def attachment_chip(parent: QWidget, name: str, kind: str) -> QLabel:
    """A file's name in a rounded chip (``QLabel#chip``)."""
    # (no emoji: many Linux desktops have no font for them)
    chip = QLabel(name, parent)
    chip.setObjectName("chip")
    chip.setToolTip(f"Attached {kind} file: {name}")
    chip.setAccessibleName(f"Attached file {name}")
    chip.setStyleSheet("padding: 1px 8px;")
    return chip


class MessageWidget(QFrame):
    """Signals: ``edit_requested(msg_id)``, ``regenerate_requested(msg_id)``, ``copied(str)``,
    ``branch_requested(msg_id, step)`` (the "‹ 2/3 ›" switcher: step -1 or +1)."""

    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    branch_requested = Signal(int, int)
    copied = Signal(str)

    def __init__(self, msg_id: int, role: str, *, model_name: str | None = None,
                 tint: bool = False, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.msg_id = msg_id
        self.role = role
        self.tint = tint
        self.content = ""       # what was given: the whole text, or its first part
        self.full_length = 0    # the whole text's length in characters
        self.shown = ""         # what is rendered (at most PREVIEW_CHARS)
        self.full_loader: Callable[[int], str] | None = None  # msg_id -> the whole text
        self.tool_decider = None  # the ToolLoop: a step's cards ask it (app.tools.cards)
        self.tool_panel: ToolCallsPanel | None = None
        self.tool_wait = False  # its tool calls wait for the user or run (no Regenerate)
        self._streaming = False
        self._regen_wanted = False
        self.setObjectName("userBubble" if role == "user" else "assistantBubble")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(14, 8, 14, 8)
        self._lay.setSpacing(6)
        who = "You" if role == "user" else (model_name or "Assistant")
        self.role_label = QLabel(who, self)
        self.role_label.setObjectName("roleLabel")
        self._lay.addWidget(self.role_label)
        self.think: ThinkCard | None = None
        self.body: QLabel | MarkdownFlow
        if role == "user":
            self.body = QLabel(self)
            self.body.setWordWrap(True)
            self.body.setTextFormat(Qt.TextFormat.PlainText)
            self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.body.setAccessibleName("Your message")
        else:
            self.body = MarkdownFlow(self, tint=tint)
            self.body.setAccessibleName("Reply")
        self._lay.addWidget(self.body)
        self.more_button = _action(self, "", "Show full message",
                                   "This message is long: only its beginning is shown here")
        self.more_button.clicked.connect(self.show_full)
        self.more_button.hide()
        self._lay.addWidget(self.more_button, 0, Qt.AlignmentFlag.AlignLeft)
        self.full_dialog: FullTextDialog | None = None
        self.error_label = QLabel(self)
        self.error_label.setObjectName("errorText")
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        self._lay.addWidget(self.error_label)
        self._build_footer()
        self.setAccessibleName("Your message" if role == "user" else "Assistant reply")

    def _build_footer(self) -> None:
        row = QHBoxLayout()
        row.setSpacing(2)
        # one line: a narrow column shows a shorter form of it (every figure is in the tooltip)
        self.stats_label = ElidedLabel("", self)
        self.stats_label.setObjectName("statsLine")
        self.stats_label.setAccessibleName("Reply statistics")
        self.copy_button = _action(self, "Copy", "Copy message", "Copy this message")
        self.copy_button.clicked.connect(self.copy)
        self.edit_button = _action(self, "Edit", "Edit message", "Edit this message and resend it")
        self.edit_button.clicked.connect(lambda: self.edit_requested.emit(self.msg_id))
        self.regen_button = _action(self, "Regenerate", "Regenerate reply", "Write this reply again")
        self.regen_button.clicked.connect(lambda: self.regenerate_requested.emit(self.msg_id))
        self.prev_button = _action(self, "‹", "Previous version", "Show the previous version")
        self.prev_button.clicked.connect(lambda: self.branch_requested.emit(self.msg_id, -1))
        self.branch_label = QLabel("", self)
        self.branch_label.setObjectName("branchLabel")
        self.branch_label.setAccessibleName("Version")
        self.next_button = _action(self, "›", "Next version", "Show the next version")
        self.next_button.clicked.connect(lambda: self.branch_requested.emit(self.msg_id, 1))
        # the stats line has a row of its own (it wraps), the actions the row below
        self._lay.addWidget(self.stats_label)
        self.stats_label.hide()
        for w in (self.prev_button, self.branch_label, self.next_button):
            row.addWidget(w)
        row.addStretch(1)
        for b in (self.copy_button, self.edit_button, self.regen_button):
            row.addWidget(b)
        self.set_branch(1, 1)
        self.edit_button.setVisible(self.role == "user")
        self.regen_button.setVisible(False)
        self._lay.addLayout(row)

    def sizeHint(self):  # noqa: N802 - Qt override
        hint = super().sizeHint()
        if self.role != "user":
            return hint
        # A user bubble is as wide as its longest line (up to its maximum width).
        fm = self.body.fontMetrics()
        longest = max((fm.horizontalAdvance(line) for line in self.shown.splitlines() or [""]),
                      default=0)
        m = self._lay.contentsMargins()
        actions = sum(b.sizeHint().width() for b in (self.copy_button, self.edit_button)) + 12
        if self.branch[1] > 1:
            actions += sum(w.sizeHint().width() for w in
                           (self.prev_button, self.branch_label, self.next_button))
        chips = sum(c.sizeHint().width() + 4 for c in getattr(self, "chips", ()))
        thumbs = sum(t.sizeHint().width() + 6 for t in getattr(self, "thumbs", ()))
        actions = max(actions, chips, thumbs)
        want = max(longest, actions, fm.horizontalAdvance("You")) + m.left() + m.right() + 4
        hint.setWidth(min(want, self.maximumWidth()))
        return hint

    def set_branch(self, index: int, count: int) -> None:
        """Show "‹ index/count ›" (hidden when the message has one version)."""
        self.branch = (index, count)
        many = count > 1
        self.branch_label.setText(f"{index}/{count}")
        for w in (self.prev_button, self.branch_label, self.next_button):
            w.setVisible(many)
        self.prev_button.setEnabled(index > 1)
        self.next_button.setEnabled(index < count)

    def set_attachments(self, files) -> None:
        """Thumbnails of the images sent with this message (a click opens one full size),
        then chips with the names of the files."""
        images = [a for a in files if a.kind == "image"]
        self.broken_images: list = []
        at = 1
        if images:
            row = QHBoxLayout()
            row.setSpacing(6)
            self.thumbs = [t for t in map(self._thumb, images) if t is not None]
            for thumb in self.thumbs:
                row.addWidget(thumb)
            row.addStretch(1)
            self._lay.insertLayout(at, row)
            at += 1
        others = self.broken_images + [a for a in files if a.kind != "image"]
        if others:
            row = QHBoxLayout()
            row.setSpacing(4)
            self.chips = [attachment_chip(self, a.name, a.kind) for a in others]
            for chip in self.chips:
                row.addWidget(chip)
            row.addStretch(1)
            self._lay.insertLayout(at, row)

    def _thumb(self, a) -> ImageThumb | None:
        try:
            thumb = ImageThumb(a, MESSAGE_THUMB, parent=self)
        except ImageError:  # damaged on disk: its name, as a file chip (below)
            self.broken_images.append(a)
            return None
        thumb.setToolTip(f"{describe(a)}: click to open it full size")
        thumb.setAccessibleName(f"Image {a.name}")
        thumb.clicked.connect(lambda _=False, att=a: self.open_image(att))
        return thumb

    def open_image(self, a) -> ImageViewer:
        """The image at full size, in its own window."""
        self.image_viewer = ImageViewer(a, self.window())
        self.image_viewer.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.image_viewer.show()
        return self.image_viewer

    def full_text(self) -> str:
        """The whole message (read back through ``full_loader`` when only a part was given)."""
        if len(self.content) < self.full_length and self.full_loader is not None:
            return self.full_loader(self.msg_id)
        return self.content

    def show_full(self) -> FullTextDialog:
        text = self.full_text()
        who = "Your message" if self.role == "user" else "Reply"
        self.full_dialog = FullTextDialog(f"{who} ({size_text(len(text))})", text, self.window())
        self.full_dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.full_dialog.destroyed.connect(self._forget_dialog)
        self.full_dialog.show()
        return self.full_dialog

    def _forget_dialog(self) -> None:
        self.full_dialog = None

    def copy(self) -> None:
        full = self.full_text()
        text = split_think(full).answer if self.role == "assistant" else full
        QGuiApplication.clipboard().setText(text.strip())
        self.copied.emit(text)

    def set_actions_enabled(self, *, edit: bool, regenerate: bool, regenerate_visible: bool) -> None:
        self.edit_button.setEnabled(edit)
        index, count = self.branch
        self.prev_button.setEnabled(edit and index > 1)
        self.next_button.setEnabled(edit and index < count)
        self._regen_wanted = regenerate_visible and self.role == "assistant"
        self.regen_button.setVisible(self._regen_wanted and not self._streaming
                                     and not self.tool_wait)
        self.regen_button.setEnabled(regenerate)

    def update_content(self, content: str, meta: dict, *, final: bool,
                       full_length: int | None = None) -> None:
        """``content`` is the whole text, or (``full_length`` longer) its first part."""
        self.content = content
        self.full_length = max(len(content), full_length or 0)
        shown = content[:preview_cut(content)] if len(content) > PREVIEW_CHARS else content
        if len(shown) < self.full_length:
            self.more_button.setText(f"Show full message ({size_text(self.full_length)})")
            self.more_button.setToolTip(f"Only the first {len(shown):,} of {self.full_length:,} "
                                        "characters are shown here; open the whole message as "
                                        "plain text")
        self.more_button.setVisible(len(shown) < self.full_length)
        if shown == self.shown and self.role == "user":
            return
        self.shown = shown
        if self.role == "user":
            self.body.setText(shown)
            return
        spans = meta.get("draft_spans") or []
        parts = split_think(shown)
        if parts.think is not None:
            if self.think is None:
                self.think = ThinkCard(self, tint=self.tint)
                self._lay.insertWidget(1, self.think)
            self.think.update_think(parts.think, done=parts.think_done, seconds=meta.get("think_s"),
                                    final=final, spans=spans, base=parts.think_offset)
            # An empty, finished block (Qwen's "thinking off" form) is not worth a card.
            self.think.setVisible(bool(parts.think.strip()) or not parts.think_done)
        answer = visible_answer(parts.answer)  # tool-call markup shows as cards instead
        self.body.set_text(answer, final=final, spans=spans, base=parts.answer_offset)
        writing = not final and "<tool_call>" in parts.answer  # a call is being written
        calls = bool(meta.get("tool_calls") or meta.get("tool_note") or writing)
        self.body.setVisible(bool(answer.strip()) or (parts.think is None and not calls))
        if calls or self.tool_panel is not None:
            self._update_tools(meta, writing=writing)
        self._update_footer(meta, final=final)

    def _update_tools(self, meta: dict, *, writing: bool) -> None:
        if self.tool_panel is None:
            self.tool_panel = ToolCallsPanel(self)
            self._lay.insertWidget(self._lay.indexOf(self.more_button), self.tool_panel)
        self.tool_panel.show_calls(self.msg_id, meta, self.tool_decider, writing=writing)
        self.tool_wait = self.tool_panel.waiting

    def _update_footer(self, meta: dict, *, final: bool) -> None:
        status = meta.get("status")
        if status == "error":
            self.error_label.setText(f"⚠ {meta.get('error', 'The reply failed.')}")
            self.error_label.show()
            self.setObjectName("errorBubble")
            self.style().unpolish(self)
            self.style().polish(self)
        stats = meta.get("stats") if final else None
        forms = [format_stats(stats), *shorter_stats(stats)]  # the line, then shorter forms
        if status == "streaming" or not final:
            forms = [f"Generating… {meta.get('tokens', 0)} tokens"]
        elif status == "cancelled":
            forms = [f"{t} · stopped" for t in forms] if forms[0] else ["Stopped"]
        elif status == "interrupted":
            forms = ["Interrupted (the app closed while this reply was streaming)"]
        if self.tint and self.role == "assistant" and final:
            forms = [forms[0] + " · tinted: text from accepted drafts",
                     *(f"{t} · tinted" for t in forms)]
        line, shorter = forms[0], forms[1:]
        self.stats_label.set_texts(line, *shorter)
        self.stats_label.setToolTip(stats_tooltip(meta.get("stats")) if final else "")
        self.stats_label.setVisible(bool(line))
        self._streaming = not final
        self.copy_button.setVisible(final)
        self.regen_button.setVisible(final and self._regen_wanted and not self.tool_wait)
