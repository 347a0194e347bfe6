"""The windows other parts of the app provide (stats dashboard, model manager), opened lazily.

``app.dashboard.DashboardWindow`` gets ``on_stats``/``on_finished``/``set_model_info``;
``app.models_window.ModelsWindow`` emits ``load_requested(str)`` and ``tune_requested(str)``.
If a module cannot be imported (not built yet, or broken), the user gets a message box, not a
crash.
"""
from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

from PySide6.QtCore import QObject
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
            self._worker.stats.connect(self.dashboard.on_stats)
            self._worker.finished.connect(self.dashboard.on_finished)
            self._worker.loaded.connect(self.dashboard.set_model_info)
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
            for sig, slot in (("tune_progress", "on_tune_progress"),
                              ("tune_finished", "on_tune_finished"),
                              ("tune_failed", "on_tune_failed")):
                target = getattr(self.models, slot, None)
                if target is not None:
                    getattr(self._worker, sig).connect(target)
        _raise(self.models)
        return self.models

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
