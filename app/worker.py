"""The worker: the only caller of the engine. A QObject living on its own QThread, which
loads the models and hosts the engine's scheduler (``engine.core.scheduler.Scheduler``):
chat replies and local-server requests queue together in its FIFO and run on this thread, so
they never race for the model (MLX streams are thread-local); when several are in flight they
decode together in one batch (``engine.decoding.decoder``, up to ``DEFAULT_STREAMS``).

Contract
--------
Called from any thread:

- ``load_model(path)``: loads a model with the injected ``loader`` (default ``engine.load``)
  on the worker thread and hands it to the scheduler.
- ``submit(request)``: queues one ``GenerationRequest`` in the scheduler (its chat template is
  rendered on the worker thread when it starts); streams ``delta``/``stats``.
- ``start_tune(path)``: runs ``engine.depth.tuner.tune`` on the loaded model (loads ``path`` first if
  it is another model); ``cancel_tune()`` stops it (the result then has ``cancelled=True``).
- ``start_verify(seconds=..., depth=None)``: runs the exactness check
  ``engine.decoding.verify.verify`` on the loaded model; ``cancel_verify()`` stops it (the
  result then has ``cancelled=True``). One check at a time: while a tune or another check runs
  it is refused with ``verify_failed`` (and a tune asked for while a check runs, ``tune_failed``).
- ``scheduler``: the shared scheduler; the local server (``app.server_control``) submits
  its requests there too.

Signals (emitted from the worker thread, delivered queued to UI objects):

- ``loading(str)``: progress text while a model loads.
- ``loaded(ModelInfo)`` / ``load_failed(str message)``. A failed load keeps the previous model:
  it is loaded again before ``load_failed``; if that fails too, ``unloaded()`` comes first.
- ``delta(request_id, text, token_ids, from_draft)``: one engine cycle's new tokens.
- ``stats(request_id, obj)``: ``PrefillStats`` first, then one ``CycleStats`` per cycle.
- ``finished(request_id, reason, summary)``: reason is "stop", "length" or "cancelled";
  ``summary`` is the reply's ``engine.metrics.summary.ReplySummary`` (the only source of its tok/s and
  acceptance figures).
- ``failed(request_id, message)``: the request ended with an error (never both finished and failed).
- ``server_stats(request_id, obj)`` / ``server_finished(request_id, reason, summary)``: the same
  for requests of other clients (the local server), with negative request ids, so the
  dashboard can show them; the chat's own signals carry only chat replies.
- ``tune_progress(done, total, message)``, ``tune_finished(TuneResult)``, ``tune_failed(str)``.
- ``verify_progress(done, total, message)``, ``verify_done(dict)`` (``VerifyResult.to_dict()``),
  ``verify_failed(str)``.
- ``warmup_progress(done, total)``: the loaded model's background warm-up (its batch shapes
  compiled ahead, one step at a time while nothing else runs: ``engine.core.warmup``).

Cancellation is a ``threading.Event`` per request, set from any thread by ``cancel(request_id)``
and checked by the engine every cycle; it is never a queued slot. Nothing escapes a slot:
exceptions become messages through ``app.errors.describe`` (``EngineError`` verbatim), and the
traceback of anything else is logged.

Per token the worker does as little as it can: one queued ``delta`` and one ``stats`` per cycle
(not per token), no text work; the time between the engine's yields counts in its tok/s.
"""
from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

import engine
from app.errors import describe
from engine.core.scheduler import (
    Done, Failed, GenRequest, Item, QueueFull, Scheduler, SchedulerClosed)
from engine.core.threadexit import release_thread_streams
from engine.decoding.decoder import DEFAULT_STREAMS
from engine.depth import tuner
from engine.errors import EngineError, GenerationError
from engine.types import Event, SamplingParams

log = logging.getLogger(__name__)

Loader = Callable[[str], Any]
# The GIL switch interval while the app runs (Python's default is 5 ms). The engine thread
# releases the GIL inside every MLX evaluation and needs it back right after; while the GUI
# thread runs Python (rendering a streamed update, repainting the dashboard) it waited up to
# the whole interval each time, several times per cycle.
GIL_SWITCH_S = 0.001
CHAT = "chat"  # the scheduler client name of the chat's replies
MAX_QUEUE = 64
VERIFY_SECONDS = 60.0  # the exactness check's time budget (its sampled replies fill it)


def has_image_parts(message: dict) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "image" for p in content)


@dataclass(frozen=True)
class GenerationRequest:
    """Everything one reply needs. ``messages`` are chat-template dicts (role, content)."""

    request_id: int
    messages: tuple[dict, ...]
    max_tokens: int = 1024
    depth: int | str = "auto"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    enable_thinking: bool | None = None
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    tools: tuple[dict, ...] = ()  # the chat template's tools (OpenAI's function form)


def _default_loader(path: str) -> Any:
    return engine.load(path)


class Worker(QObject):
    """See the module docstring for the contract."""

    loading = Signal(str)
    loaded = Signal(object)
    load_failed = Signal(str)
    unloaded = Signal()
    delta = Signal(int, str, object, object)
    stats = Signal(int, object)
    finished = Signal(int, str, object)
    failed = Signal(int, str)
    server_stats = Signal(int, object)
    server_finished = Signal(int, str, object)
    tune_progress = Signal(int, int, str)
    tune_finished = Signal(object)
    tune_failed = Signal(str)
    verify_progress = Signal(int, int, str)
    verify_done = Signal(object)
    verify_failed = Signal(str)
    warmup_progress = Signal(int, int)

    _sig_load = Signal(str)
    _sig_wake = Signal()
    _sig_tune = Signal(str)
    _sig_verify = Signal(float, int)
    _sig_warm = Signal()

    def __init__(self, *, loader: Loader | None = None) -> None:
        super().__init__()
        self._loader: Loader = loader or _default_loader
        self._model: Any = None
        self._lock = threading.Lock()
        self._cancels: dict[int, threading.Event] = {}
        self._tune_cancel = threading.Event()
        self._verify_cancel = threading.Event()
        self._job: str | None = None  # "tune" or "verify" while one is asked for or runs
        self._other_ids: dict[str, int] = {}
        self._other_seq = itertools.count(1)
        self.scheduler = Scheduler.hosted(self._sig_wake.emit, max_queue=MAX_QUEUE,
                                          max_streams=DEFAULT_STREAMS)
        self.scheduler.add_observer(self._observe)
        self.scheduler.add_warmup_listener(self.warmup_progress.emit)
        self._warm_queued = False
        self._sig_warm.connect(self.warm_tick, Qt.ConnectionType.QueuedConnection)
        self._sig_load.connect(self.load)
        # queued even when emitted on the worker thread: one request per event-loop turn
        self._sig_wake.connect(self.on_wake, Qt.ConnectionType.QueuedConnection)
        self._sig_tune.connect(self.tune)
        self._sig_verify.connect(self.verify)

    # -- called from any thread ------------------------------------------------------------
    def load_model(self, path: str) -> None:
        self._sig_load.emit(str(path))

    def submit(self, request: GenerationRequest) -> None:
        """Queue ``request``; ``cancel(request.request_id)`` works even before it starts."""
        cancel = threading.Event()
        with self._lock:
            self._cancels[request.request_id] = cancel
        req = GenRequest(
            id=f"{CHAT}-{request.request_id}", prompt_ids=(), max_tokens=request.max_tokens,
            depth=request.depth, sampling=request.sampling, seed=request.seed,
            stop_strings=request.stop_strings, cancel=cancel, client=CHAT,
            render=lambda model: self._render(request, model))
        try:
            self.scheduler.submit(req, lambda item: self._on_item(request.request_id, cancel, item))
        except (QueueFull, SchedulerClosed) as exc:
            self._forget(request.request_id)
            self.failed.emit(request.request_id, f"The reply could not be queued: {exc}.")

    generate = submit

    def start_tune(self, path: str = "") -> None:
        with self._lock:
            busy = self._job == "verify"
            if not busy:
                self._job = "tune"
        if busy:
            self.tune_failed.emit("The exactness check is running: wait for it to finish "
                                  "(or cancel it) before tuning.")
            return
        self._tune_cancel.clear()
        self._sig_tune.emit(str(path))

    def start_verify(self, seconds: float = VERIFY_SECONDS, depth: int | None = None) -> bool:
        """Start the exactness check on the loaded model (on the worker thread). False, with
        ``verify_failed``, while a tune or another check runs."""
        with self._lock:
            job = self._job
            if job is None:
                self._job = "verify"
        if job is not None:
            self.verify_failed.emit(
                "The exactness check is already running." if job == "verify" else
                "The depth tuner is running: wait for it to finish (or cancel it) before "
                "checking exactness.")
            return False
        self._verify_cancel.clear()
        self._sig_verify.emit(float(seconds), -1 if depth is None else int(depth))
        return True

    def cancel_verify(self) -> None:
        self._verify_cancel.set()

    @property
    def busy(self) -> str | None:
        """``"tune"`` or ``"verify"`` while one is asked for or runs, else None."""
        return self._job

    def cancel(self, request_id: int) -> None:
        with self._lock:
            ev = self._cancels.get(request_id)
        if ev is not None:
            ev.set()

    def cancel_tune(self) -> None:
        self._tune_cancel.set()

    def cancel_all(self) -> None:
        with self._lock:
            events = list(self._cancels.values())
        for ev in events:
            ev.set()
        self.scheduler.cancel_all()
        self._tune_cancel.set()
        self._verify_cancel.set()

    @property
    def model_info(self) -> Any:
        model = self._model
        return model.info if model is not None else None

    # -- slots (worker thread) ---------------------------------------------------------------
    @Slot()
    def on_wake(self) -> None:
        """Run the scheduler's next request (chat or server) to its end."""
        try:
            self.scheduler.run_next()
        except BaseException as exc:  # noqa: BLE001 - nothing escapes a slot
            self._log_unexpected(exc, "the scheduler")
        self._queue_warm()

    @Slot()
    def warm_tick(self) -> None:
        """One step of the model's background warm-up (``engine.core.warmup``) while no
        request waits and no tune or check runs; the next step is queued behind any request
        that arrives meanwhile."""
        self._warm_queued = False
        try:
            more = self._job is None and self.scheduler.warm_step()
        except BaseException as exc:  # noqa: BLE001 - nothing escapes a slot
            self._log_unexpected(exc, "the warm-up")
            more = False
        if more:
            self._queue_warm()

    def _queue_warm(self) -> None:
        if not self._warm_queued:
            self._warm_queued = True
            self._sig_warm.emit()

    @Slot(str)
    def load(self, path: str) -> None:
        try:
            self._load(path)
        except BaseException as exc:  # noqa: BLE001 - nothing escapes a slot
            self._log_unexpected(exc, "load")
            self.load_failed.emit(describe(exc))

    def _load(self, path: str) -> None:
        previous = self._model.info.path if self._model is not None else None
        self.loading.emit(f"Loading {path}…")
        self._set_model(None)  # free the previous model before reading the next one
        t0 = time.perf_counter()
        try:
            model = self._loader(path)
        except BaseException:
            self._restore(previous)
            raise
        self._set_model(model)
        log.info("loaded %s in %.2f s", path, time.perf_counter() - t0)
        self.loaded.emit(model.info)

    def _set_model(self, model: Any) -> None:
        self._model = model
        self.scheduler.set_model(model)
        if model is not None:
            self._queue_warm()

    def _restore(self, path: str | None) -> None:
        """After a failed load: load the previous model again (the app keeps using it)."""
        if path is None:
            return
        self.loading.emit(f"Loading {path} again…")
        try:
            self._set_model(self._loader(path))
        except BaseException as exc:  # noqa: BLE001 - the original failure is what is reported
            log.error("could not reload the previous model %s: %s", path, exc)
            self.unloaded.emit()

    # -- a chat reply, on the worker thread (called by the scheduler) ------------------------
    def _render(self, req: GenerationRequest, model: Any) -> Any:
        messages = list(req.messages)
        if any(has_image_parts(m) for m in messages):
            return self._render_images(req, model, messages)
        if req.tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
            from engine.server.templates import chat_prompt_ids  # the server's tool rendering

            ids = chat_prompt_ids(model, messages, tools=list(req.tools) or None,
                                  enable_thinking=req.enable_thinking)
        else:
            ids = model.chat_ids(messages, enable_thinking=req.enable_thinking)
        if self._prompt_opens_think(model, ids):
            self.delta.emit(req.request_id, "<think>\n", [], [])
        return ids

    def _render_images(self, req: GenerationRequest, model: Any, messages: list[dict]) -> Any:
        """A prompt with images: ``Model.chat_prompt`` (the engine's contract in
        ``engine.vision``) renders the parts and returns the ids with the images placed."""
        chat_prompt = getattr(model, "chat_prompt", None)
        if chat_prompt is None or not getattr(model.info, "vision", False):
            raise GenerationError("This model cannot read images (it has no vision encoder); "
                                  "load a vision model to send images.")
        if req.tools:
            raise GenerationError("Images and tools in the same chat are not supported yet; "
                                  "turn the tools off for this chat to send images.")
        prompt = chat_prompt(messages, enable_thinking=req.enable_thinking)
        if self._prompt_opens_think(model, list(getattr(prompt, "ids", prompt))):
            self.delta.emit(req.request_id, "<think>\n", [], [])
        return prompt

    def _on_item(self, rid: int, cancel: threading.Event, item: Item) -> None:
        """The chat reply's sink: one ``delta`` and one ``stats`` per cycle, then the end."""
        if isinstance(item, Event):
            if item.prefill is not None:
                self.stats.emit(rid, item.prefill)
            if item.token_ids or item.text:
                flags = list(item.stats.from_draft) if item.stats is not None else []
                self.delta.emit(rid, item.text, list(item.token_ids), flags)
            if item.stats is not None:
                self.stats.emit(rid, item.stats)
            return
        if isinstance(item, Done):
            reason = "cancelled" if cancel.is_set() else (item.summary.finish_reason or "stop")
            self._forget(rid)
            self.finished.emit(rid, reason, replace(item.summary, finish_reason=reason))
        elif isinstance(item, Failed):
            self._forget(rid)
            self.failed.emit(rid, describe(item.error))

    def _forget(self, rid: int) -> None:
        with self._lock:
            self._cancels.pop(rid, None)

    def _observe(self, req: GenRequest, item: Item) -> None:
        """Requests of other clients (the local server), for the dashboard."""
        if req.client == CHAT:
            return
        rid = self._other_ids.setdefault(req.id, -next(self._other_seq))
        if isinstance(item, Event):
            for obj in (item.prefill, item.stats):
                if obj is not None:
                    self.server_stats.emit(rid, obj)
        elif isinstance(item, (Done, Failed)):
            self._other_ids.pop(req.id, None)
            if isinstance(item, Done):
                self.server_finished.emit(rid, item.summary.finish_reason or "stop", item.summary)

    @staticmethod
    def _prompt_opens_think(model: Any, ids: list[int]) -> bool:
        """True when the chat template itself opened a ``<think>`` block (Qwen3.5 with thinking)."""
        tok = getattr(model, "tokenizer", None)
        if tok is None or not ids:
            return False
        try:
            tail = tok.decode(ids[-8:])
        except Exception:  # noqa: BLE001 - a tokenizer quirk must not fail the request
            return False
        return tail.rstrip().endswith("<think>")

    @Slot(str)
    def tune(self, path: str) -> None:
        try:
            self._tune(path)
        except BaseException as exc:  # noqa: BLE001 - nothing escapes a slot
            self._log_unexpected(exc, "tune")
            self.tune_failed.emit(describe(exc))
        finally:
            self._end_job("tune")

    def _end_job(self, job: str) -> None:
        with self._lock:
            if self._job == job:
                self._job = None
        self._queue_warm()

    @Slot(float, int)
    def verify(self, seconds: float, depth: int) -> None:
        try:
            result = self._verify(seconds, None if depth < 0 else depth)
        except BaseException as exc:  # noqa: BLE001 - nothing escapes a slot
            self._end_job("verify")
            self._log_unexpected(exc, "verify")
            self.verify_failed.emit(describe(exc))
            return
        self._end_job("verify")  # before the signal: a view may start the next one at once
        self.verify_done.emit(result)

    def _verify(self, seconds: float, depth: int | None) -> dict:
        # looked up at each call: tests replace it
        from engine.decoding import verify as verify_mod

        if self._model is None:
            raise EngineError("Load a model before checking its exactness.")

        def progress(done: int, total: int, message: str) -> None:
            self.verify_progress.emit(int(done), int(total), str(message))

        result = verify_mod.verify(self._model, depth=depth, seconds=seconds,
                                   progress=progress, cancel=self._verify_cancel)
        return result.to_dict() if hasattr(result, "to_dict") else dict(result)

    def _tune(self, path: str) -> None:
        current = self._model.info.path if self._model is not None else None
        if path and path != current:
            self._load(path)
        if self._model is None:
            raise EngineError("Load a model before tuning it.")

        def progress(done: int, total: int, message: str) -> None:
            self.tune_progress.emit(int(done), int(total), str(message))

        result = tuner.tune(self._model, depths=tuner.DEPTHS, progress=progress,
                            cancel=self._tune_cancel)  # the same depths as `engine tune`
        self._end_job("tune")  # before the signal: a view may start a check at once
        self.tune_finished.emit(result)

    @staticmethod
    def _log_unexpected(exc: BaseException, what: str) -> None:
        if isinstance(exc, EngineError):
            log.warning("%s failed: %s", what, exc)
        else:
            log.error("%s failed with an unexpected error", what, exc_info=exc)


class WorkerThread:
    """Owns the QThread the worker lives on; ``shutdown`` cancels, quits and joins."""

    def __init__(self, *, loader: Loader | None = None) -> None:
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        self.thread = QThread()
        self.thread.setObjectName("mtpchat-worker")
        self.worker = Worker(loader=loader)
        self.worker.moveToThread(self.thread)
        # run on the worker's thread as it ends (DirectConnection): its MLX state is dropped
        # while the interpreter is whole, or the process may abort at exit
        self.thread.finished.connect(release_thread_streams, Qt.ConnectionType.DirectConnection)
        self.thread.start()

    def shutdown(self, *, timeout_ms: int = 120_000) -> bool:
        """Cancel everything and join the thread. Returns False if it did not stop in time."""
        if not self.thread.isRunning():
            return True
        scheduler = self.worker.scheduler
        self.worker.cancel_all()
        scheduler.stop()  # no new requests; whatever waits is cancelled
        self.thread.quit()
        ok = self.thread.wait(timeout_ms)
        if not ok:
            log.error("worker thread did not stop within %d ms", timeout_ms)
            return ok
        while scheduler.run_next():  # the cancelled leftovers end (no model call)
            pass
        return ok
