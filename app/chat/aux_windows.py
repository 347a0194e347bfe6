"""The windows other parts of the app provide (stats dashboard, model manager), opened lazily.

``app.dashboard.DashboardWindow`` gets ``on_stats``/``on_finished``/``set_model_info`` and the
tuner hooks (``on_tune_progress(done, total, message)``, ``set_tuner_result(result)``, its
``tune_requested()``/``tune_cancel_requested()``); ``app.models_window.ModelsWindow`` emits
``load_requested(str)`` and ``tune_requested(str)`` and gets whichever tuner hooks it defines.
If a module cannot be imported (not built yet, or broken), the user gets a message box, not a
crash.
"""
from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QMessageBox, QWidget

from app.worker import Worker

log = logging.getLogger(__name__)


class AuxWindows(QObject):
    def __init__(self, parent: QWidget, worker: Worker, *, on_load: Callable[[str], None],
                 on_tune: Callable[[str], None]) -> None:
        super().__init__(parent)
        self._parent = parent
        self._worker = worker
        self._on_load = on_load
        self._on_tune = on_tune
        self.dashboard: QWidget | None = None
        self.models: QWidget | None = None
        self.model_info = None
        worker.tune_progress.connect(self.on_tune_progress)

    def _import(self, module: str, cls: str, what: str):
        try:
            return getattr(importlib.import_module(module), cls)
        except Exception as exc:  # noqa: BLE001 - any failure means "not available"
            log.warning("%s is not available: %s", what, exc, exc_info=True)
            QMessageBox.information(self._parent, f"{what} unavailable",
                                    f"The {what.lower()} is not available in this build.\n\n{exc}")
            return None

    def show_dashboard(self) -> QWidget | None:
        if self.dashboard is None:
            cls = self._import("app.dashboard", "DashboardWindow", "Dashboard")
            if cls is None:
                return None
            self.dashboard = cls(parent=None)
            w = self._worker
            w.stats.connect(self.dashboard.on_stats)
            w.finished.connect(self.dashboard.on_finished)
            w.loaded.connect(self.dashboard.set_model_info)
            self._connect_tuner(self.dashboard)
            if self.model_info is not None:
                self.dashboard.set_model_info(self.model_info)
        _raise(self.dashboard)
        return self.dashboard

    def show_models(self) -> QWidget | None:
        if self.models is None:
            cls = self._import("app.models_window", "ModelsWindow", "Model manager")
            if cls is None:
                return None
            self.models = cls(parent=None)
            self.models.load_requested.connect(self._on_load)
            self.models.tune_requested.connect(self._on_tune)
            self._connect_tuner(self.models)
        _raise(self.models)
        return self.models

    def _connect_tuner(self, window: QWidget) -> None:
        """Tuner hooks are optional on either window: connect the ones it has."""
        w = self._worker
        for sig, slot in ((w.tune_finished, "set_tuner_result"),
                          (w.tune_finished, "on_tune_finished"),
                          (w.tune_failed, "on_tune_failed")):
            target = getattr(window, slot, None)
            if callable(target):
                sig.connect(target)
        requested = getattr(window, "tune_requested", None)
        if requested is not None and window is self.dashboard:
            requested.connect(lambda: self._on_tune(""))
        cancel = getattr(window, "tune_cancel_requested", None)
        if cancel is not None:  # a direct call: the worker thread is busy tuning
            cancel.connect(lambda: w.cancel_tune())

    @Slot(int, int, str)
    def on_tune_progress(self, done: int, total: int, message: str) -> None:
        """Forward progress as ``(done, total, message)`` to a 3-parameter hook, else as text."""
        for window in (self.dashboard, self.models):
            hook = getattr(window, "on_tune_progress", None) if window is not None else None
            if not callable(hook):
                continue
            try:
                n = len(inspect.signature(hook).parameters)
            except (TypeError, ValueError):
                n = 1
            if n >= 3:
                hook(done, total, message)
            else:
                hook(f"Tuning {done}/{total}: {message}")

    def close_all(self) -> None:
        for w in (self.dashboard, self.models):
            if w is not None:
                w.close()
                w.deleteLater()
        self.dashboard = self.models = None


def _raise(w: QWidget) -> None:
    w.show()
    w.raise_()
    w.activateWindow()
