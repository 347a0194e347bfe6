"""The tool cards of a reply: one collapsible card per call (server, tool, the exact
arguments, its state) with Allow / Always allow / Deny while it waits for the user, and the
card of a tool's result (``ToolResultBox``, shown by ``app.tools.result_widget``).

``ToolCallsPanel.show_calls(msg_id, meta, decider)``: ``meta["tool_calls"]`` as cards;
``decider`` (the ``ToolLoop``) answers ``is_live(msg_id)`` (the step still waits: buttons) and
takes ``decide(msg_id, call_id, decision)``. A pending call whose step is not live (the app
closed while it waited) shows as not run.
"""
from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton,
                               QVBoxLayout, QWidget)

STATE_TEXT = {
    "pending": "waiting for your approval",
    "running": "running…",
    "done": "done",
    "error": "failed",
    "denied": "denied",
    "cancelled": "cancelled",
    "skipped": "not run: step limit",
}
MAX_SHOWN = 4000  # characters of arguments or result shown in a card (the whole is copied)


def _mono_label(parent: QWidget, text: str, name: str) -> QLabel:
    label = QLabel(parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    label.setText(text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "\n…")
    label.setAccessibleName(name)
    return label


class Collapsible(QFrame):
    """A card: a toggle line over a body that opens and closes."""

    def __init__(self, parent: QWidget | None, title: str, *, open_: bool,
                 name: str = "toolCard") -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(10, 4, 10, 6)
        self._lay.setSpacing(4)
        self.toggle = QToolButton(self)
        self.toggle.setObjectName("msgAction")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setText(title)
        self.toggle.setAccessibleName(f"Show or hide: {title}")
        self._lay.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.body = QWidget(self)
        self.body_lay = QVBoxLayout(self.body)
        self.body_lay.setContentsMargins(0, 0, 0, 0)
        self.body_lay.setSpacing(6)
        self._lay.addWidget(self.body)
        self.toggle.toggled.connect(self._on_toggled)
        self.toggle.setChecked(open_)
        self._on_toggled(open_)

    def _on_toggled(self, on: bool) -> None:
        self.body.setVisible(on)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)


def arguments_text(arguments: dict) -> str:
    return json.dumps(arguments, indent=2, ensure_ascii=False)


class ToolCallCard(Collapsible):
    def __init__(self, parent: QWidget | None, msg_id: int, rec: dict, *, live: bool,
                 decider) -> None:
        state = rec.get("state", "pending")
        if state in ("pending", "running") and not live:
            state = "cancelled"  # the app closed while it waited
        self.state = state
        where = f"{rec.get('server')} › {rec.get('tool')}" if rec.get("server") else rec.get("name")
        title = f"Tool call: {where} — {STATE_TEXT.get(state, state)}"
        super().__init__(parent, title, open_=state == "pending",
                         name="toolCardPending" if state == "pending" else "toolCard")
        self.rec, self.msg_id, self.decider = rec, msg_id, decider
        self.body_lay.addWidget(_mono_label(self.body, arguments_text(rec.get("arguments", {})),
                                            "Tool call arguments"))
        self.buttons: dict[str, QPushButton] = {}
        if state == "pending":
            self._add_buttons()

    def _add_buttons(self) -> None:
        note = QLabel(f"The model wants to run “{self.rec.get('tool')}” on "
                      f"“{self.rec.get('server')}” with these arguments. Nothing runs until "
                      "you allow it.", self.body)
        note.setWordWrap(True)
        note.setObjectName("muted")
        self.body_lay.addWidget(note)
        row = QHBoxLayout()
        row.setSpacing(6)
        for key, text, tip in (
                ("allow", "Allow", "Run this call once"),
                ("always", "Always allow this tool",
                 f"Run {self.rec.get('tool')} of {self.rec.get('server')} without asking from now on"),
                ("deny", "Deny", "Do not run it; the model is told you declined")):
            b = QPushButton(text, self.body)
            b.setToolTip(tip)
            b.setAccessibleName(text)
            b.clicked.connect(lambda _=False, k=key: self.decide(k))
            if key == "allow":
                b.setDefault(True)
            row.addWidget(b)
            self.buttons[key] = b
        row.addStretch(1)
        self.body_lay.addLayout(row)

    def decide(self, decision: str) -> None:
        for b in self.buttons.values():
            b.setEnabled(False)
        if self.decider is not None:
            self.decider.decide(self.msg_id, self.rec["id"], decision)


class ToolCallsPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(6)
        self.cards: list[ToolCallCard] = []
        self.note = QLabel(self)
        self.note.setObjectName("muted")
        self.note.setWordWrap(True)
        self.note.hide()
        self._key = None
        self.waiting = False  # a call waits for the user or runs

    def show_calls(self, msg_id: int, meta: dict, decider, *, writing: bool = False) -> None:
        """``writing``: the reply is still streaming a call (shown as a line until it ends)."""
        records = meta.get("tool_calls") or []
        live = bool(decider is not None and decider.is_live(msg_id))
        self.waiting = live and any(r.get("state") in ("pending", "running") for r in records)
        note = meta.get("tool_note") or ("Writing a tool call…" if writing and not records else "")
        key = (json.dumps(records, sort_keys=True, default=str), live, note)
        if key == self._key:
            return
        self._key = key
        for card in self.cards:
            self._lay.removeWidget(card)
            card.hide()
            card.deleteLater()
        self.cards = [ToolCallCard(self, msg_id, rec, live=live, decider=decider)
                      for rec in records]
        for card in self.cards:
            self._lay.addWidget(card)
        self._lay.removeWidget(self.note)
        self._lay.addWidget(self.note)
        self.note.setText(note)
        self.note.setVisible(bool(note))


class ToolResultBox(Collapsible):
    """A tool's result: collapsed to one line (tool, state, time), the text inside."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, "Tool result", open_=False)
        self.text = _mono_label(self.body, "", "Tool result")
        self.body_lay.addWidget(self.text)

    def set_result(self, content: str, meta: dict) -> None:
        where = f"{meta.get('server')} › {meta.get('tool') or meta.get('name')}"
        kind = "error" if meta.get("is_error") else "result"
        secs = meta.get("seconds")
        took = f" in {secs:.2f} s" if isinstance(secs, (int, float)) and secs else ""
        first = content.strip().splitlines()[0] if content.strip() else "(empty)"
        first = first if len(first) <= 70 else first[:69] + "…"
        title = f"Tool {kind}: {where}{took} — {first}"
        self.toggle.setText(title)
        self.toggle.setAccessibleName(f"Show or hide: {title}")
        self.text.setText(content if len(content) <= MAX_SHOWN else content[:MAX_SHOWN] + "\n…")
