"""The worker: the only caller of the engine. A QObject living on its own QThread.

Contract
--------
Slots (run on the worker thread; call them through queued signals or ``submit``/``load_model``):

- ``load(path)``: loads a model with the injected ``loader`` (default ``engine.load``).
- ``generate(request)``: runs one ``GenerationRequest``; streams ``delta``/``stats``.
- ``tune(path)``: runs ``engine.tuner.tune`` on the loaded model (loads ``path`` first if it
  is another model); ``cancel_tune()`` stops it (the result then has ``cancelled=True``).

Signals (emitted from the worker thread, delivered queued to UI objects):

- ``loading(str)``: progress text while a model loads.
- ``loaded(ModelInfo)`` / ``load_failed(str message)``. A failed load keeps the previous model:
  it is loaded again before ``load_failed``; if that fails too, ``unloaded()`` comes first.
- ``delta(request_id, text, token_ids, from_draft)``: one engine cycle's new tokens.
- ``stats(request_id, obj)``: ``PrefillStats`` first, then one ``CycleStats`` per cycle.
- ``finished(request_id, reason, summary)``: reason is "stop", "length" or "cancelled";
  ``summary`` is the reply's ``engine.summary.ReplySummary`` (the only source of its tok/s and
  acceptance figures).
- ``failed(request_id, message)``: the request ended with an error (never both finished and failed).
- ``tune_progress(done, total, message)``, ``tune_finished(TuneResult)``, ``tune_failed(str)``.

Cancellation is a ``threading.Event`` per request, set from any thread by ``cancel(request_id)``
and checked by the engine every cycle; it is never a queued slot. Nothing escapes a slot:
exceptions become messages through ``app.errors.describe`` (``EngineError`` verbatim), and the
traceback of anything else is logged.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

import engine
from app.errors import describe
from engine import tuner
from engine.errors import EngineError
from engine.summary import ReplySummary, ReplyTally
from engine.types import SamplingParams

log = logging.getLogger(__name__)

Loader = Callable[[str], Any]


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
    tune_progress = Signal(int, int, str)
    tune_finished = Signal(object)
    tune_failed = Signal(str)

    _sig_load = Signal(str)
    _sig_generate = Signal(object)
    _sig_tune = Signal(str)

    def __init__(self, *, loader: Loader | None = None) -> None:
        super().__init__()
        self._loader: Loader = loader or _default_loader
        self._model: Any = None
        self._lock = threading.Lock()
        self._cancels: dict[int, threading.Event] = {}
        self._tune_cancel = threading.Event()
        self._sig_load.connect(self.load)
        self._sig_generate.connect(self.generate)
        self._sig_tune.connect(self.tune)

    # -- called from any thread ------------------------------------------------------------
    def load_model(self, path: str) -> None:
        self._sig_load.emit(str(path))

    def submit(self, request: GenerationRequest) -> None:
        """Queue ``request``; ``cancel(request.request_id)`` works even before it starts."""
        with self._lock:
            self._cancels[request.request_id] = threading.Event()
        self._sig_generate.emit(request)

    def start_tune(self, path: str = "") -> None:
        self._tune_cancel.clear()
        self._sig_tune.emit(str(path))

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
        self._tune_cancel.set()

    @property
    def model_info(self) -> Any:
        model = self._model
        return model.info if model is not None else None

    # -- slots (worker thread) ---------------------------------------------------------------
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
        self._model = None  # free the previous model before reading the next one
        t0 = time.perf_counter()
        try:
            model = self._loader(path)
        except BaseException:
            self._restore(previous)
            raise
        self._model = model
        log.info("loaded %s in %.2f s", path, time.perf_counter() - t0)
        self.loaded.emit(model.info)

    def _restore(self, path: str | None) -> None:
        """After a failed load: load the previous model again (the app keeps using it)."""
        if path is None:
            return
        self.loading.emit(f"Loading {path} again…")
        try:
            self._model = self._loader(path)
        except BaseException as exc:  # noqa: BLE001 - the original failure is what is reported
            log.error("could not reload the previous model %s: %s", path, exc)
            self.unloaded.emit()

    @Slot(object)
    def generate(self, request: GenerationRequest) -> None:
        rid = request.request_id
        with self._lock:
            cancel = self._cancels.setdefault(rid, threading.Event())
        try:
            self._generate(request, cancel)
        except BaseException as exc:  # noqa: BLE001 - nothing escapes a slot
            self._log_unexpected(exc, f"request {rid}")
            self.failed.emit(rid, describe(exc))
        finally:
            with self._lock:
                self._cancels.pop(rid, None)

    def _generate(self, req: GenerationRequest, cancel: threading.Event) -> None:
        rid = req.request_id
        tally = ReplyTally()
        if cancel.is_set():
            self.finished.emit(rid, "cancelled", tally.summary())
            return
        model = self._model
        if model is None:
            raise EngineError("No model is loaded yet.")
        ids = model.chat_ids(list(req.messages), enable_thinking=req.enable_thinking)
        if self._prompt_opens_think(model, ids):
            self.delta.emit(rid, "<think>\n", [], [])
        reason = "stop"
        for ev in model.generate(ids, max_tokens=req.max_tokens, depth=req.depth,
                                 sampling=req.sampling, seed=req.seed, cancel=cancel,
                                 stop_strings=req.stop_strings):
            tally.add(ev)
            if ev.prefill is not None:
                self.stats.emit(rid, ev.prefill)
            if ev.token_ids or ev.text:
                flags = list(ev.stats.from_draft) if ev.stats is not None else []
                self.delta.emit(rid, ev.text, list(ev.token_ids), flags)
            if ev.stats is not None:
                self.stats.emit(rid, ev.stats)
            if ev.finish_reason is not None:
                reason = ev.finish_reason  # the last event: the generator ends by itself
        if cancel.is_set():
            reason = "cancelled"
        summary: ReplySummary = replace(tally.summary(), finish_reason=reason)
        self.finished.emit(rid, reason, summary)

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

    def _tune(self, path: str) -> None:
        current = self._model.info.path if self._model is not None else None
        if path and path != current:
            self._load(path)
        if self._model is None:
            raise EngineError("Load a model before tuning it.")

        def progress(done: int, total: int, message: str) -> None:
            self.tune_progress.emit(int(done), int(total), str(message))

        result = tuner.tune(self._model, progress=progress, cancel=self._tune_cancel)
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
        self.thread = QThread()
        self.thread.setObjectName("mtpchat-worker")
        self.worker = Worker(loader=loader)
        self.worker.moveToThread(self.thread)
        self.thread.start()

    def shutdown(self, *, timeout_ms: int = 120_000) -> bool:
        """Cancel everything and join the thread. Returns False if it did not stop in time."""
        if not self.thread.isRunning():
            return True
        self.worker.cancel_all()
        self.thread.quit()
        ok = self.thread.wait(timeout_ms)
        if not ok:
            log.error("worker thread did not stop within %d ms", timeout_ms)
        return ok
