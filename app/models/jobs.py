"""Background work for the model manager: downloads and Hub pre-checks, off the UI thread.

``ThreadJob`` is cancellable work on its own Python thread (so downloads and grafts go on while
the user chats, whatever window is open) reporting through Qt signals, which Qt delivers queued
to the UI thread; ``DownloadJob`` runs ``engine.hub.pull.pull`` as one, ``GraftJob``
(``app.models.graft``) the graft. ``run_in_pool`` runs a short call (a repo pre-check) on the global
QThreadPool and hands back its result or error message through a signal.

Signals of ``DownloadJob``: ``progress(DownloadProgress)``, ``finished(DownloadResult)``,
``failed(str message)``; ``state`` is one of queued/running/done/cancelled/failed.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QThreadPool, Signal

from app.errors import describe
from app.models.units import fmt_bytes
from engine.errors import EngineError

log = logging.getLogger(__name__)


OFFLINE_MESSAGE = "Can't reach Hugging Face: check your internet connection."


def _message(exc: BaseException, kept_bytes: int = 0) -> str:
    """``describe(exc)``, with the traceback logged when it is not an engine error. Not
    reaching the Hub reads as a plain sentence (no socket error), which mentions the parts kept
    only when ``kept_bytes`` were downloaded."""
    from engine.hub.client import HubNetworkError, HubOfflineError

    if isinstance(exc, HubNetworkError) and not isinstance(exc, HubOfflineError):
        log.info("the Hub is unreachable: %s", exc)
        if kept_bytes > 0:
            return (f"{OFFLINE_MESSAGE} The {fmt_bytes(kept_bytes)} already downloaded are "
                    "kept: Retry continues from there.")
        return OFFLINE_MESSAGE
    if not isinstance(exc, EngineError):
        log.error("unexpected error in a model-manager task", exc_info=exc)
    return describe(exc)


class ThreadJob(QObject):
    """Cancellable work on its own Python thread, reported through Qt signals (queued to the
    UI thread). A subclass gives ``work(cancel)`` (returns a result with a ``status``),
    ``done_status`` (the status that means done; any other is a cancel) and may override
    ``error_message(exc)`` and ``thread_name``."""

    progress = Signal(object)
    finished = Signal(object)
    failed = Signal(str)
    _ended = Signal(object, str)  # (result, error) from the thread; handled on the UI thread
    done_status = ""
    thread_name = "job"

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = "queued"
        self.last = None  # the latest progress
        self.result = None
        self.error: str | None = None
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended.connect(self._on_ended)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """(Re)start: a resumed or retried job picks up what earlier runs left on disk."""
        if self.running:
            return
        self._cancel = threading.Event()
        self.state, self.error, self.result = "running", None, None
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    def work(self, cancel: threading.Event):
        raise NotImplementedError

    def error_message(self, exc: BaseException) -> str:
        return _message(exc)

    def _run(self) -> None:
        from engine.core.threadexit import release_thread_streams

        try:
            result = self.work(self._cancel)
        except BaseException as exc:  # noqa: BLE001 - reported to the UI, never raised in a thread
            _emit(self._ended, None, self.error_message(exc))
            return
        finally:
            release_thread_streams()  # (a conversion or a calibration ran MLX on this thread)
        _emit(self._ended, result, "")

    def _on_ended(self, result, error: str) -> None:
        # On the UI thread, so `state` changes exactly when the UI hears about it.
        if error:
            self.state, self.error = "failed", error
            self.failed.emit(error)
            return
        self.result = result
        self.state = "done" if result.status == self.done_status else "cancelled"
        self.finished.emit(result)

    def _on_progress(self, p) -> None:
        self.last = p
        _emit(self.progress, p)


class DownloadJob(ThreadJob):
    done_status = "installed"

    def __init__(self, repo_id: str, *, revision: str = "main", convert_bits: int | None = None,
                 store=None, options: dict | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.repo_id, self.revision, self.convert_bits = repo_id, revision, convert_bits
        self.store = store
        self.options = dict(options or {})
        self.thread_name = f"download {repo_id}"

    def work(self, cancel: threading.Event):
        from engine.hub.pull import pull

        return pull(self.repo_id, revision=self.revision, convert_bits=self.convert_bits,
                    store=self.store, progress=self._on_progress, cancel=cancel, **self.options)

    def error_message(self, exc: BaseException) -> str:
        return _message(exc, getattr(self.last, "bytes_done", 0) or 0)


class _Relay(QObject):
    done = Signal(object)
    error = Signal(str)


def run_in_pool(fn: Callable[[], Any], *, on_done: Callable[[Any], None],
                on_error: Callable[[str], None], parent: QObject) -> _Relay:
    """Run ``fn()`` on the global QThreadPool; ``on_done``/``on_error`` run on the UI thread."""
    relay = _Relay(parent)
    relay.done.connect(on_done)
    relay.error.connect(on_error)

    def task() -> None:
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the UI
            _emit(relay.error, _message(exc))
            return
        _emit(relay.done, value)

    QThreadPool.globalInstance().start(task)
    return relay


def _emit(signal, *args) -> None:
    try:
        signal.emit(*args)
    except RuntimeError:  # the window was deleted while the thread ran
        pass
