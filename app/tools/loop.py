"""``ToolLoop``: the model's tool calls, confirmed by the user, run, and fed back until the
reply is a final answer.

Contract
--------
- When a reply of a chat with tools finishes ("done"), its text — the model's own output,
  never a tool's result — is parsed by the server's parser (``engine.server.toolcalls``);
  each call becomes a record in the message's ``meta["tool_calls"]`` (``app.tools.history``).
- A call runs only once allowed: ``decide(msg_id, call_id, "allow" | "always" | "deny")``
  (the confirmation card's buttons); "always" also remembers the tool for its server
  (``ToolPrefs``), and such tools run without asking from then on. A name no tool has is
  answered with an error result; a denied call with "The user declined ...". The conversation
  is busy (``ChatSession.tool_holds``) until every call of the step is answered; the results
  are then saved as ``tool`` messages, in the calls' order, and the next step streams.
- Stop (``ChatSession.stopping``) cancels the pending and running calls of every step
  (``cancelled``; the results already in are kept) and ends the loop.
- At most ``ToolPrefs.max_steps`` steps with calls per reply (since the user's message): the
  calls of one more are ``skipped`` and the reply ends with a note.
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal, Slot

from app.chat.markdown import split_think
from app.chat.session import STORAGE_ERRORS, ChatSession
from app.tools.history import ANSWERED
from app.tools.host import CallResult
from app.tools.manager import ToolsManager
from engine.server.toolcalls import parse_tool_calls

DENIED = "The user declined to run this tool call."


@dataclass
class Step:
    conv_id: int
    msg_id: int
    records: list[dict]
    results: dict[str, CallResult] = field(default_factory=dict)
    futures: dict[str, concurrent.futures.Future] = field(default_factory=dict)

    def record(self, call_id: str) -> dict | None:
        return next((r for r in self.records if r["id"] == call_id), None)

    @property
    def settled(self) -> bool:
        return all(r["state"] not in ("pending", "running") for r in self.records)


class ToolLoop(QObject):
    """Signal ``changed(conv_id)``: a step's cards changed (the view shows them again)."""

    changed = Signal(int)

    def __init__(self, session: ChatSession, manager: ToolsManager,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.conversations = session.conversations
        self.manager = manager
        self.steps: dict[int, Step] = {}  # conv_id -> the step waiting on its calls
        session.tools_for = self.tool_specs
        session.stream_finished.connect(self.on_stream_finished)
        session.stopping.connect(self.cancel_all)
        manager.call_done.connect(self.on_call_done)

    def tool_specs(self, conv_id: int) -> list[dict]:
        return self.manager.catalog_for(conv_id).specs()

    def is_live(self, msg_id: int) -> bool:
        """True while the step of ``msg_id`` waits on its calls (its buttons are live)."""
        return any(s.msg_id == msg_id for s in self.steps.values())

    # -- a reply ended ---------------------------------------------------------------------
    @Slot(int, int, str)
    def on_stream_finished(self, conv_id: int, msg_id: int, status: str) -> None:
        if status != "done" or conv_id in self.steps:
            return
        catalog = self.manager.catalog_for(conv_id)
        msg = self.conversations.message(msg_id)
        if not catalog or msg is None:
            return
        _, calls = parse_tool_calls(split_think(msg.content).answer, catalog.schemas())
        if not calls:
            return
        over = self.steps_in_turn(conv_id, before=msg_id) >= self.manager.prefs.max_steps
        records = []
        for c in calls:
            target = catalog.resolve(c.name)
            server, tool = target if target else ("", c.name)
            state = "skipped" if over else ("pending" if target else "error")
            records.append({"id": c.id, "name": c.name, "server": server, "tool": tool,
                            "arguments": c.arguments, "state": state})
        step = Step(conv_id, msg_id, records)
        for r in records:
            if r["state"] == "error":
                step.results[r["id"]] = CallResult(f"There is no tool named {r['name']}.", True)
        meta = dict(msg.meta)
        meta["tool_calls"] = records
        if over:
            meta["tool_note"] = (f"Stopped: this reply reached its limit of "
                                 f"{self.manager.prefs.max_steps} tool steps.")
        self._save(step, meta)
        if over:
            self.changed.emit(conv_id)
            return
        self.steps[conv_id] = step
        self.session.tool_holds.add(conv_id)
        self.session.busy_changed.emit(True)
        self._advance(step)

    def steps_in_turn(self, conv_id: int, *, before: int) -> int:
        """Steps with tool calls since the user's last message, before ``before``."""
        n = 0
        for m in reversed(self.conversations.messages(conv_id)):
            if m.id >= before:
                continue
            if m.role == "user":
                break
            if m.role == "assistant" and (m.meta or {}).get("tool_calls"):
                n += 1
        return n

    # -- confirmations and results ---------------------------------------------------------
    def decide(self, msg_id: int, call_id: str, decision: str) -> None:
        step = next((s for s in self.steps.values() if s.msg_id == msg_id), None)
        rec = step.record(call_id) if step else None
        if rec is None or rec["state"] != "pending":
            return
        if decision == "deny":
            rec["state"] = "denied"
            step.results[call_id] = CallResult(DENIED, True)
        else:
            if decision == "always":
                self.manager.allow_always(rec["server"], rec["tool"])
            self._run(step, rec)
        self._advance(step)

    def _advance(self, step: Step) -> None:
        for rec in step.records:
            if rec["state"] == "pending" and self.manager.prefs.allows(rec["server"], rec["tool"]):
                self._run(step, rec)
        self._save(step)
        if step.settled:
            self._finish(step)
        else:
            self.changed.emit(step.conv_id)

    def _run(self, step: Step, rec: dict) -> None:
        rec["state"] = "running"
        step.futures[rec["id"]] = self.manager.call(
            step.conv_id, rec["id"], rec["server"], rec["tool"], rec["arguments"])

    @Slot(int, str, object)
    def on_call_done(self, conv_id: int, call_id: str, result: CallResult) -> None:
        step = self.steps.get(conv_id)
        rec = step.record(call_id) if step else None
        if rec is None or rec["state"] != "running":
            return  # cancelled meanwhile
        rec["state"] = "error" if result.is_error else "done"
        step.results[call_id] = result
        self._advance(step)

    def _finish(self, step: Step, *, then_continue: bool = True) -> None:
        """Save the results as ``tool`` messages and start the next step."""
        self.steps.pop(step.conv_id, None)
        self.session.tool_holds.discard(step.conv_id)
        try:
            for rec in step.records:
                result = step.results.get(rec["id"])
                if rec["state"] in ANSWERED and result is not None:
                    self.conversations.store.add_message(
                        step.conv_id, "tool", result.text,
                        meta={"tool_call_id": rec["id"], "name": rec["name"],
                              "server": rec["server"], "tool": rec["tool"],
                              "is_error": result.is_error, "seconds": result.seconds})
        except STORAGE_ERRORS as exc:
            self.session.storage_failed.emit(f"The tool results could not be saved ({exc}).")
            then_continue = False
        self.changed.emit(step.conv_id)
        if then_continue and self.session.continue_reply(step.conv_id) is not None:
            return
        self.session.busy_changed.emit(self.session.busy)

    @Slot()
    def cancel_all(self) -> None:
        """Stop: every pending or running call is cancelled; the loop ends."""
        for step in list(self.steps.values()):
            for rec in step.records:
                if rec["state"] in ("pending", "running"):
                    rec["state"] = "cancelled"
                    fut = step.futures.get(rec["id"])
                    if fut is not None:
                        fut.cancel()
            self._save(step)
            self._finish(step, then_continue=False)

    def _save(self, step: Step, meta: dict | None = None) -> None:
        msg = self.conversations.message(step.msg_id)
        if msg is None:
            return
        meta = dict(meta if meta is not None else msg.meta)
        meta["tool_calls"] = step.records
        try:
            self.conversations.save_reply(step.msg_id, msg.content, meta)
        except STORAGE_ERRORS as exc:
            self.session.storage_failed.emit(f"The tool calls could not be saved ({exc}).")
