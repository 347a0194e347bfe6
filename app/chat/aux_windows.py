"""The chat window's other windows (stats dashboard, model manager), made on first use.

Both follow the ``LoadedModel`` (``set_model_info`` / ``set_loaded_model``) and show the tuner's
run as ``TunerView``s. The dashboard also gets every reply's ``stats`` and ``finished``; the
model manager asks for loads and tuning runs (``load_requested(str)``, ``tune_requested(str)``).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QWidget

from app.dashboard.recorder import SessionRecord
from app.dashboard.window import DashboardWindow
from app.loaded_model import LoadedModel
from app.models.window import ModelsWindow
from app.window_state import (
    SettingsStore,
    fit_to_screen,
    restore_geometry,
    save_geometry,
)
from app.worker import Worker

log = logging.getLogger(__name__)


class TunerView(Protocol):
    """A window that shows the depth tuner's run (the worker's ``tune_*`` signals)."""

    def on_tune_progress(self, done: int, total: int, message: str) -> None: ...

    def on_tune_finished(self, result: object) -> None: ...

    def on_tune_failed(self, message: str) -> None: ...


class AuxWindows(QObject):
    def __init__(self, parent: QWidget, worker: Worker, model: LoadedModel, *,
                 on_load: Callable[[str], None], on_tune: Callable[[str], None],
                 store: SettingsStore | None = None) -> None:
        super().__init__(parent)
        self._worker = worker
        self._model = model
        self._on_load = on_load
        self._on_tune = on_tune
        self._store = store
        self.dashboard: DashboardWindow | None = None
        self.models: ModelsWindow | None = None
        self.on_models_window: Callable[[ModelsWindow], None] | None = None  # made: wire it
        # the session's figures from the start, for a dashboard opened late
        self.record = SessionRecord()
        self.tuning: tuple[int, int, str] | None = None  # a tune running: its last progress
        self.verifying: tuple[int, int, str] | None = None  # an exactness check, likewise
        worker.stats.connect(self.on_stats)
        worker.finished.connect(self.on_finished)
        worker.server_stats.connect(self.on_stats)  # the local server's requests count too
        worker.server_finished.connect(self.on_finished)
        worker.tune_progress.connect(self.on_tune_progress)
        worker.tune_finished.connect(self.on_tune_finished)
        worker.tune_failed.connect(self.on_tune_failed)
        worker.verify_progress.connect(self.on_verify_progress)
        worker.verify_done.connect(self.on_verify_ended)
        worker.verify_failed.connect(self.on_verify_ended)
        model.changed.connect(self.on_model_changed)

    def show_dashboard(self) -> DashboardWindow:
        if self.dashboard is None:
            self.dashboard = DashboardWindow(parent=None, record=self.record)
            w = self._worker
            self.dashboard.tune_requested.connect(lambda: self.start_tune(""))
            # a direct call: the worker thread is busy tuning
            self.dashboard.tune_cancel_requested.connect(lambda: w.cancel_tune())
            self.dashboard.attach_verifier(w)
            self.dashboard.engine_line.watch(w.scheduler.status)
            self.dashboard.set_model_info(self._model.info)
            if self.tuning is not None:
                self.dashboard.on_tune_progress(*self.tuning)
            if self.verifying is not None:
                self.dashboard.verify.on_progress(*self.verifying)
            self._restore(self.dashboard, "dashboard")
            add_close_keys(self.dashboard)
        _raise(self.dashboard)
        return self.dashboard

    def show_models(self) -> ModelsWindow:
        if self.models is None:
            self.models = ModelsWindow(parent=None)
            self.models.load_requested.connect(self._on_load)
            self.models.tune_requested.connect(self.start_tune)
            self.models.set_loaded_model(self._model.info)
            if self.on_models_window is not None:
                self.on_models_window(self.models)
            fit_to_screen(self.models, (self.models.width(), self.models.height()))
            self._restore(self.models, "models")
            add_close_keys(self.models)
            if self.tuning is not None:
                self.models.on_tune_progress(*self.tuning)
        _raise(self.models)
        return self.models

    def start_tune(self, path: str) -> None:
        """A tune asked for from any window: every tuner view shows it running."""
        self.tuning = (0, 0, "Starting…")
        if self.dashboard is not None:
            self.dashboard.on_tune_progress(*self.tuning)
        self._on_tune(path)

    def _restore(self, w: QWidget, name: str) -> None:
        if self._store is not None:
            restore_geometry(self._store, name, w)

    @Slot(int, object)
    def on_stats(self, request_id: int, obj: object) -> None:
        if self.dashboard is not None:
            self.dashboard.on_stats(request_id, obj)
        else:
            self.record.add_stats(request_id, obj)

    @Slot(int, str, object)
    def on_finished(self, request_id: int, reason: str, summary) -> None:
        if self.dashboard is not None:
            self.dashboard.on_finished(request_id, reason, summary)
        else:
            self.record.finish(reason, summary)

    def _tuner_views(self) -> list[TunerView]:
        return [v for v in (self.dashboard, self.models) if v is not None]

    @Slot(object)
    def on_model_changed(self, info) -> None:
        if self.dashboard is not None:
            self.dashboard.set_model_info(info)
        if self.models is not None:
            self.models.set_loaded_model(info)

    @Slot(int, int, str)
    def on_tune_progress(self, done: int, total: int, message: str) -> None:
        self.tuning = (done, total, message)
        for view in self._tuner_views():
            view.on_tune_progress(done, total, message)

    @Slot(object)
    def on_tune_finished(self, result: object) -> None:
        self.tuning = None
        for view in self._tuner_views():
            view.on_tune_finished(result)

    @Slot(str)
    def on_tune_failed(self, message: str) -> None:
        self.tuning = None
        for view in self._tuner_views():
            view.on_tune_failed(message)

    @Slot(int, int, str)
    def on_verify_progress(self, done: int, total: int, message: str) -> None:
        self.verifying = (done, total, message)

    @Slot(object)
    def on_verify_ended(self, _result: object) -> None:
        """The check ended (a verdict, or a failure's message): nothing left to replay,
        unless the failure was a second check refused while the first still runs."""
        if self._worker.busy != "verify":
            self.verifying = None

    def close_all(self) -> None:
        for name, w in (("dashboard", self.dashboard), ("models", self.models)):
            if w is not None:
                if self._store is not None:
                    save_geometry(self._store, name, w)
                w.close()
                w.deleteLater()
        self.dashboard = self.models = None


def add_close_keys(w: QWidget) -> QShortcut:
    """Esc and Ctrl+W (⌘W on a Mac, plus the platform's own Close key) close ``w``."""
    keys = [QKeySequence(Qt.Key.Key_Escape), QKeySequence("Ctrl+W"),
            *QKeySequence.keyBindings(QKeySequence.StandardKey.Close)]
    named = {k.toString(): k for k in keys if not k.isEmpty()}
    sc = QShortcut(w)
    sc.setKeys(list(named.values()))
    sc.setContext(Qt.ShortcutContext.WindowShortcut)
    sc.activated.connect(w.close)
    return sc


def _raise(w: QWidget) -> None:
    w.show()
    w.raise_()
    w.activateWindow()
