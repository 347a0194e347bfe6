"""The loaded model, as every view sees it: one ``LoadedModel`` per app, fed by the worker.

The chat window's picker and composer, the dashboard, the model manager and the chat session
all read ``info`` here and observe ``changed``; nobody else keeps a copy of the model's info.

Signals:
- ``changed(info)``: ``info`` (a ``ModelInfo``, or None when no model is held) changed.
- ``status_changed()``: a load started, progressed, failed or ended (``loading_path``,
  ``progress_text`` and ``error`` changed).

A failed load keeps the previous model: the worker reloads it before it reports the failure
(``Worker.load``), so ``info`` does not change and ``error`` says why the new one did not load.
If the worker ends up without a model it says so (``unloaded``) and ``info`` becomes None.
"""
from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal, Slot

from engine.hub.store import mark_used
from engine.types import ModelInfo

log = logging.getLogger(__name__)


class LoadedModel(QObject):
    changed = Signal(object)
    status_changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.info: ModelInfo | None = None
        self.loading_path: str | None = None
        self.progress_text = ""
        self.error = ""

    @property
    def ready(self) -> bool:
        """A model is held and no other is being loaded: replies can be requested."""
        return self.info is not None and self.loading_path is None

    def attach(self, worker) -> None:
        """Follow ``worker`` (an ``app.worker.Worker``)."""
        worker.loading.connect(self.on_loading)
        worker.loaded.connect(self.on_loaded)
        worker.load_failed.connect(self.on_load_failed)
        worker.unloaded.connect(self.on_unloaded)

    def begin(self, path: str, text: str = "") -> None:
        """A load of ``path`` was requested."""
        self.loading_path = str(path)
        self.progress_text = text
        self.error = ""
        self.status_changed.emit()

    @Slot(str)
    def on_loading(self, text: str) -> None:
        self.progress_text = text
        self.status_changed.emit()

    @Slot(object)
    def on_loaded(self, info: ModelInfo) -> None:
        if self.loading_path is None and self.info is not None and self.info.layout == "remote":
            log.info("%s loaded in the worker; the chat keeps the served model", info.name)
            return  # a served model was chosen while this one loaded (or a tune loaded it)
        self.loading_path, self.progress_text, self.error = None, "", ""
        self.info = info
        try:  # the model manager's "Last used" column
            mark_used(info.path)
        except (OSError, ValueError) as exc:  # a read-only data folder: only the column is stale
            log.warning("cannot record that %s was used: %s", info.path, exc)
        self.changed.emit(info)
        self.status_changed.emit()

    def set_remote(self, info: ModelInfo) -> None:
        """A model served elsewhere (``app.remote``): nothing to load here."""
        self.loading_path, self.progress_text, self.error = None, "", ""
        self.info = info
        self.changed.emit(info)
        self.status_changed.emit()

    @Slot(str)
    def on_load_failed(self, message: str) -> None:
        """Also for failures found before the worker is asked (a missing folder)."""
        self.loading_path, self.progress_text, self.error = None, "", message
        self.status_changed.emit()

    @Slot()
    def on_unloaded(self) -> None:
        if self.info is not None:
            self.info = None
            self.changed.emit(None)
