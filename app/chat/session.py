"""The chat controller: turns user actions into worker requests and worker signals into
persisted, coalesced message updates. Owns no widgets; conversations are ``Conversations``'
(``session.conversations``), the model is the ``LoadedModel``'s.

Contract
--------
- One ``Stream`` per request id. Deltas are appended to the stream's pending buffer as they
  arrive (cheap) and applied on a 40 ms timer that emits ``stream_updated(conv_id, msg_id)``;
  the reply is written to SQLite at most every ``FLUSH_S`` seconds and on finish, so a crash or
  a quit loses at most the last half second.
- Deltas of a request the user stopped (or of any unknown request) are dropped; its
  ``finished``/``failed`` still finalises the message it was writing into.
- A stream always writes into its own conversation, whatever conversation is on screen.
- Only one request generates at a time (``busy``); a stopped one may still be finishing.
- A finished reply's ``meta["stats"]`` is its ``ReplySummary.to_dict()``.
- A save that fails (disk full, read-only, I/O error) loses nothing: the reply stays in
  memory (``live_messages`` keeps showing it), ``storage_failed(message)`` is emitted once, and
  the save is retried every ``RETRY_MS`` until it lands (then ``storage_recovered()``). A user
  message that cannot be saved is not sent (``send`` returns None; the composer keeps it).
"""
from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app.chat.conversations import Conversations
from app.chat.images import model_reads_images
from app.chat.markdown import THINK_CLOSE, THINK_OPEN
from app.chat.settings import ChatSettings
from app.loaded_model import LoadedModel
from app.tools.history import template_message
from app.worker import GenerationRequest, Worker
from engine.metrics.summary import ReplySummary

log = logging.getLogger(__name__)

TICK_MS = 40
FLUSH_S = 0.5
RETRY_MS = 2000
STORAGE_ERRORS = (sqlite3.Error, OSError)
_request_ids = count(1)


@dataclass
class Stream:
    """A reply being written: text so far (``content``), draft spans, timing, status."""

    request_id: int
    conv_id: int
    msg_id: int
    meta: dict
    content: str = ""
    pending: list[str] = field(default_factory=list)
    spans: list[list[int]] = field(default_factory=list)
    pending_len: int = 0
    tokens: int = 0
    cycles: int = 0
    got_prefill: bool = False
    stop_requested: bool = False
    t_start: float = field(default_factory=time.monotonic)
    t_first: float | None = None
    think_t0: float | None = None
    last_flush: float = field(default_factory=time.monotonic)
    dirty: bool = False

    def add_delta(self, text: str, n_tokens: int, flags: list) -> None:
        """Queue ``text``; tint the share of it that came from accepted drafts."""
        base = len(self.content) + self.pending_len
        if flags and text:
            per = len(text) / max(1, n_tokens)
            run_start = None
            for i, f in enumerate(list(flags) + [False]):
                if f and run_start is None:
                    run_start = i
                elif not f and run_start is not None:
                    a, b = base + round(run_start * per), base + round(i * per)
                    if b > a:
                        if self.spans and self.spans[-1][1] == a:
                            self.spans[-1][1] = b
                        else:
                            self.spans.append([a, b])
                    run_start = None
        self.pending.append(text)
        self.pending_len += len(text)
        self.tokens += n_tokens
        if n_tokens and self.t_first is None:
            self.t_first = time.monotonic()

    def apply_pending(self) -> bool:
        if not self.pending:
            return False
        old = len(self.content)
        self.content += "".join(self.pending)
        self.pending.clear()
        self.pending_len = 0
        self._track_think(old)
        self.dirty = True
        return True

    def _track_think(self, old_len: int) -> None:
        now = time.monotonic()
        if self.think_t0 is None and self.content.lstrip().startswith(THINK_OPEN):
            self.think_t0 = self.t_first or now
        if (self.think_t0 is not None and "think_s" not in self.meta
                and self.content.find(THINK_CLOSE, max(0, old_len - len(THINK_CLOSE))) >= 0):
            self.meta["think_s"] = round(now - self.think_t0, 2)

    def live_meta(self) -> dict:
        meta = dict(self.meta)
        meta["draft_spans"] = self.spans
        meta["tokens"] = self.tokens
        return meta


class ChatSession(QObject):
    """Signals: ``stream_updated(conv_id, msg_id)``, ``stream_finished(conv_id, msg_id, status)``,
    ``busy_changed(bool)``, ``conversations_changed()``, ``messages_changed(conv_id)``,
    ``storage_failed(message)``, ``storage_recovered()``, ``stopping()`` (Stop was pressed:
    the tool loop cancels its pending calls).

    Tools (``app.tools.loop``): ``tools_for(conv_id)`` is the chat template's tool list for a
    reply (none by default); ``tool_holds`` are conversations whose reply waits on a tool
    call (busy meanwhile); ``continue_reply(conv_id)`` starts the next step.

    Reply sources: the worker, plus any added with ``add_source`` (``app.remote.source``: a
    model served elsewhere); ``source_for(info)`` picks the one a reply goes to, Stop cancels
    on all of them."""

    storage_failed = Signal(str)
    storage_recovered = Signal()
    stream_updated = Signal(int, int)
    stream_finished = Signal(int, int, str)
    busy_changed = Signal(bool)
    conversations_changed = Signal()
    messages_changed = Signal(int)
    stopping = Signal()

    def __init__(self, conversations: Conversations, worker: Worker, model: LoadedModel,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.conversations = conversations
        self.worker = worker
        self.model = model
        self.streams: dict[int, Stream] = {}
        self.dropped_deltas = 0
        self.tools_for: Callable[[int], list[dict]] = lambda conv_id: []
        self.tool_holds: set[int] = set()
        self.closed = False
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self.on_tick)
        self.unsaved: dict[int, tuple[int, str, dict]] = {}  # msg_id -> (conv, text, meta)
        self.storage_error: str | None = None
        self._retry = QTimer(self)
        self._retry.setInterval(RETRY_MS)
        self._retry.timeout.connect(self.retry_saves)
        self.sources: list = []
        # where a reply to a model goes: the worker, or another source (a remote server)
        self.source_for: Callable[[object], object] = lambda info: self.worker
        self.add_source(worker)

    def add_source(self, source) -> None:
        """Follow a reply source with the worker's interface (``submit``, ``cancel`` and the
        ``delta``/``stats``/``finished``/``failed`` signals): ``app.remote.source``."""
        self.sources.append(source)
        source.delta.connect(self.on_delta)
        source.stats.connect(self.on_stats)
        source.finished.connect(self.on_finished)
        source.failed.connect(self.on_failed)

    # -- queries -----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.tool_holds) or any(not s.stop_requested for s in self.streams.values())

    def active_stream(self) -> Stream | None:
        for s in self.streams.values():
            if not s.stop_requested:
                return s
        return None

    def stream_for_message(self, msg_id: int) -> Stream | None:
        for s in self.streams.values():
            if s.msg_id == msg_id:
                return s
        return None

    def streaming_conversations(self) -> set[int]:
        return {s.conv_id for s in self.streams.values()}

    def live_messages(self, conv_id: int) -> dict[int, tuple[str, dict]]:
        """Replies of ``conv_id`` being written: msg_id -> (text so far, live meta)."""
        live = {m: (text, meta) for m, (c, text, meta) in self.unsaved.items() if c == conv_id}
        live.update({s.msg_id: (s.content, s.live_meta()) for s in self.streams.values()
                     if s.conv_id == conv_id})
        return live

    def can_reply(self) -> bool:
        return not self.busy and self.model.ready

    def settings_for(self, conv_id: int) -> ChatSettings:
        return self.conversations.settings_for(conv_id)

    # -- user actions ---------------------------------------------------------------------------
    def new_conversation(self) -> int:
        conv_id = self.conversations.create()
        self.conversations_changed.emit()
        return conv_id

    def send(self, conv_id: int, text: str, attachments=()) -> int | None:
        """Append a user message (with its ``attachments``) and start its reply; returns the
        request id, or None when the message could not be saved (``storage_failed`` says why)."""
        def write() -> None:
            self.conversations.title_from(conv_id, text)
            self.conversations.add_user_message(conv_id, text, attachments=attachments)
        return self._write_then_reply(conv_id, write)

    def regenerate(self, conv_id: int, msg_id: int) -> int | None:
        """A new version of assistant message ``msg_id``; the old one stays as a branch."""
        return self._write_then_reply(
            conv_id, lambda: self.conversations.new_version_of(conv_id, msg_id))

    def edit_and_resend(self, conv_id: int, msg_id: int, text: str) -> int | None:
        """A new version of user message ``msg_id`` with ``text`` (its attachments kept), and a
        reply to it; the old version and what followed it stay as a branch."""
        def write() -> None:
            old = self.conversations.new_version_of(conv_id, msg_id)
            kept = self.conversations.attachments(conv_id).get(msg_id, []) if old else []
            self.conversations.add_user_message(
                conv_id, text, attachments=kept, parent_id=old.parent_id if old else None)
            if old is not None:
                self.conversations.retitle_after_edit(conv_id, old, text)
        return self._write_then_reply(conv_id, write)

    def _write_then_reply(self, conv_id: int, write) -> int | None:
        try:
            write()
            return self._start_reply(conv_id)
        except STORAGE_ERRORS as exc:
            self._storage_failed(exc)
            self.messages_changed.emit(conv_id)
            return None

    def stop_conversation(self, conv_id: int) -> None:
        """Stop the reply being written in ``conv_id`` (if any)."""
        if conv_id in self.tool_holds or any(s.conv_id == conv_id for s in self.streams.values()):
            self.stop()

    def stop(self) -> None:
        self.stopping.emit()
        for s in self.streams.values():
            if not s.stop_requested:
                s.stop_requested = True
                for source in self.sources:  # (an id unknown to a source is ignored)
                    source.cancel(s.request_id)
        self.busy_changed.emit(self.busy)

    def history(self, conv_id: int, settings: ChatSettings, *, extra: tuple = ()) -> list[dict]:
        """The prompt's messages: the system prompt, then the branch on screen from
        ``context_from`` on (older turns dropped by the user are left out), attachments
        inlined with their names, images as content parts when the model reads them
        (``app.chat.images.user_content``); ``extra`` messages (not yet saved) are appended."""
        msgs = []
        if settings.system_prompt.strip():
            msgs.append({"role": "system", "content": settings.system_prompt})
        start = self.conversations.context_from(conv_id) or 0
        files = self.conversations.attachments(conv_id)
        vision = model_reads_images(self.model.info)
        for m in self.conversations.messages(conv_id):
            if m.id < start:
                continue
            msg = template_message(m, files.get(m.id, ()), vision=vision)
            if msg is not None:
                msgs.append(msg)
        msgs.extend(extra)
        return msgs

    def continue_reply(self, conv_id: int) -> int | None:
        """The next step of a reply that called tools (their results are saved)."""
        return self._write_then_reply(conv_id, lambda: None)

    def _start_reply(self, conv_id: int) -> int:
        settings = self.settings_for(conv_id)
        messages = self.history(conv_id, settings)
        rid = next(_request_ids)
        info = self.model.info
        thinking = settings.thinking if info is not None and info.supports_thinking else None
        meta = {"status": "streaming", "model": info.name if info is not None else None,
                "request_id": rid}
        msg_id = self.conversations.add_reply(conv_id, meta)
        self.streams[rid] = Stream(rid, conv_id, msg_id, meta)
        req = GenerationRequest(
            request_id=rid, messages=tuple(messages), max_tokens=settings.max_tokens,
            depth=settings.depth_for(info), sampling=settings.sampling(),
            enable_thinking=thinking, tools=tuple(self.tools_for(conv_id)))
        self.source_for(info).submit(req)
        self._timer.start()
        self.messages_changed.emit(conv_id)
        self.conversations_changed.emit()
        self.busy_changed.emit(True)
        return rid

    # -- worker signals ------------------------------------------------------------------------
    @Slot(int, str, object, object)
    def on_delta(self, request_id: int, text: str, token_ids: list, from_draft: list) -> None:
        s = self.streams.get(request_id)
        if s is None or s.stop_requested or self.closed:
            self.dropped_deltas += 1
            return
        s.add_delta(text, len(token_ids), from_draft)

    @Slot(int, object)
    def on_stats(self, request_id: int, obj: object) -> None:
        s = self.streams.get(request_id)
        if s is None:
            return
        if hasattr(obj, "prompt_tokens"):
            s.got_prefill = True
        else:
            s.cycles += 1

    @Slot()
    def on_tick(self) -> None:
        now = time.monotonic()
        for s in list(self.streams.values()):
            if s.apply_pending():
                self.stream_updated.emit(s.conv_id, s.msg_id)
            if s.dirty and now - s.last_flush >= FLUSH_S:
                self._flush(s)
        if not self.streams:
            self._timer.stop()

    def _flush(self, s: Stream) -> None:
        self._save(s.conv_id, s.msg_id, s.content, s.live_meta())
        s.last_flush = time.monotonic()
        s.dirty = False

    def _save(self, conv_id: int, msg_id: int, content: str, meta: dict) -> bool:
        try:
            self.conversations.save_reply(msg_id, content, meta)
        except STORAGE_ERRORS as exc:
            self.unsaved[msg_id] = (conv_id, content, dict(meta))
            self._storage_failed(exc)
            return False
        self.unsaved.pop(msg_id, None)
        return True

    def _storage_failed(self, exc: BaseException) -> None:
        log.error("cannot save the chat: %s", exc)
        if self.storage_error is None:
            self.storage_error = (
                f"Chats cannot be saved right now ({exc}). Replies are kept in memory and "
                "saved as soon as there is room: free some disk space.")
            self.storage_failed.emit(self.storage_error)
        if not self._retry.isActive():
            self._retry.start()

    @Slot()
    def retry_saves(self) -> None:
        """Try every reply that could not be saved again; all saved ends the failure."""
        for msg_id, (conv_id, content, meta) in list(self.unsaved.items()):
            if not self._save(conv_id, msg_id, content, meta):
                return
        self._retry.stop()
        if self.storage_error is not None:
            self.storage_error = None
            log.info("chat saving works again")
            self.storage_recovered.emit()

    @Slot(int, str, object)
    def on_finished(self, request_id: int, reason: str, summary: ReplySummary) -> None:
        s = None if self.closed else self.streams.pop(request_id, None)
        if s is None:
            return
        if not s.stop_requested:
            s.apply_pending()
        s.meta["status"] = "cancelled" if reason == "cancelled" else "done"
        s.meta["finish_reason"] = reason
        s.meta["stats"] = summary.to_dict()
        self._finalize(s)

    @Slot(int, str)
    def on_failed(self, request_id: int, message: str) -> None:
        s = None if self.closed else self.streams.pop(request_id, None)
        if s is None:
            return
        s.apply_pending()
        s.meta["status"] = "error"
        s.meta["error"] = message
        self._finalize(s)

    def _finalize(self, s: Stream) -> None:
        if self._save(s.conv_id, s.msg_id, s.content, s.live_meta()):
            try:
                self.conversations.touch(s.conv_id)
            except STORAGE_ERRORS as exc:
                self._storage_failed(exc)
        self.stream_finished.emit(s.conv_id, s.msg_id, s.meta["status"])
        self.busy_changed.emit(self.busy)
        if not self.streams:
            self._timer.stop()

    def shutdown(self) -> None:
        """Save every stream as it stands (called before the worker is stopped); later
        worker signals (already queued) are ignored."""
        self.closed = True
        for s in list(self.streams.values()):
            s.apply_pending()
            s.meta["status"] = "interrupted"
            self._flush(s)
        self.streams.clear()
        self._timer.stop()
        self._retry.stop()
        for msg_id, (_conv, content, _meta) in self.unsaved.items():
            log.error("quitting with reply %s unsaved (%d characters): the disk stayed full",
                      msg_id, len(content))
