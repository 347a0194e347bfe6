"""The chat window's other windows (stats dashboard, model manager), made on first use.

Both follow the ``LoadedModel`` (``set_model_info`` / ``set_loaded_model``) and show the tuner's
run as ``TunerView``s. The dashboard also gets every reply's ``stats`` and ``finished``; the
model manager asks for loads and tuning runs (``load_requested(str)``, ``tune_requested(str)``).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QWidget

from app.dashboard.window import DashboardWindow
from app.loaded_model import LoadedModel
from app.models.window import ModelsWindow
from app.worker import Worker

log = logging.getLogger(__name__)


class TunerView(Protocol):
    """A window that shows the depth tuner's run (the worker's ``tune_*`` signals)."""

    def on_tune_progress(self, done: int, total: int, message: str) -> None: ...

    def on_tune_finished(self, result: object) -> None: ...

    def on_tune_failed(self, message: str) -> None: ...


class AuxWindows(QObject):
    def __init__(self, parent: QWidget, worker: Worker, model: LoadedModel, *,
                 on_load: Callable[[str], None], on_tune: Callable[[str], None]) -> None:
        super().__init__(parent)
        self._worker = worker
        self._model = model
        self._on_load = on_load
        self._on_tune = on_tune
        self.dashboard: DashboardWindow | None = None
        self.models: ModelsWindow | None = None
        worker.tune_progress.connect(self.on_tune_progress)
        worker.tune_finished.connect(self.on_tune_finished)
        worker.tune_failed.connect(self.on_tune_failed)
        model.changed.connect(self.on_model_changed)

    def show_dashboard(self) -> DashboardWindow:
        if self.dashboard is None:
            self.dashboard = DashboardWindow(parent=None)
            w = self._worker
            w.stats.connect(self.dashboard.on_stats)
            w.finished.connect(self.dashboard.on_finished)
            w.server_stats.connect(self.dashboard.on_stats)  # the local server's requests
            w.server_finished.connect(self.dashboard.on_finished)
            self.dashboard.tune_requested.connect(lambda: self._on_tune(""))
            # a direct call: the worker thread is busy tuning
            self.dashboard.tune_cancel_requested.connect(lambda: w.cancel_tune())
            self.dashboard.set_model_info(self._model.info)
        _raise(self.dashboard)
        return self.dashboard

    def show_models(self) -> ModelsWindow:
        if self.models is None:
            self.models = ModelsWindow(parent=None)
            self.models.load_requested.connect(self._on_load)
            self.models.tune_requested.connect(self._on_tune)
            self.models.set_loaded_model(self._model.info)
        _raise(self.models)
        return self.models

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
        for view in self._tuner_views():
            view.on_tune_progress(done, total, message)

    @Slot(object)
    def on_tune_finished(self, result: object) -> None:
        for view in self._tuner_views():
            view.on_tune_finished(result)

    @Slot(str)
    def on_tune_failed(self, message: str) -> None:
        for view in self._tuner_views():
            view.on_tune_failed(message)

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
