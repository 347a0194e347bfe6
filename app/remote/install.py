"""The chat window's remote models: ``install_remote(window)`` adds the reply source for
models served elsewhere, the "Connect to a Server…" and "Cluster…" entries (View menu, model
picker, model manager) and returns the ``RemoteControl`` that switches to such a model."""
from __future__ import annotations

import logging

from PySide6.QtCore import QObject

from app.remote.connect_dialog import ConnectDialog
from app.remote.connections import (Connection, ConnectionStore, is_remote, parse_remote_path,
                                    remote_info, remote_path)
from app.remote.source import RemoteSource

log = logging.getLogger(__name__)


class RemoteControl(QObject):
    def __init__(self, window, store: ConnectionStore | None = None) -> None:
        super().__init__(window)
        self.window = window
        self.store = store or ConnectionStore()
        self.source = RemoteSource(self)
        session = window.session
        session.add_source(self.source)
        session.source_for = lambda info: (self.source if info is not None
                                           and is_remote(info.path) else window.worker)
        self.source.finished.connect(window.aux.on_finished)  # the dashboard's figures
        window.picker.connect_requested.connect(self.open_connect)
        self.dialog: ConnectDialog | None = None
        self.cluster = None

    def knows(self, path: str) -> bool:
        """Whether a saved connection serves the model of ``path`` (a ``remote_path``)."""
        base, model = parse_remote_path(path)
        conn = self.store.find(base)
        return conn is not None and model in conn.models

    def use(self, path: str) -> None:
        """Chat with the served model ``path`` (a ``remote_path``)."""
        base, model = parse_remote_path(path)
        conn = self.store.find(base)
        w = self.window
        if conn is None or model not in conn.models:
            w.model.on_load_failed(f"No saved connection serves {model} at {base}: connect "
                                   "to the server again (View › Connect to a Server…).")
            return
        if w.session.busy:
            w.session.stop()
        self.source.use(conn, model)
        w.model.set_remote(remote_info(conn, model))

    def open_connect(self, url: str = "") -> ConnectDialog:
        self.dialog = ConnectDialog(self.window, store=self.store, url=url)
        self.dialog.saved.connect(self.on_saved)
        self.dialog.show()
        return self.dialog

    def open_cluster(self):
        from app.remote.cluster_dialog import ClusterDialog

        if self.cluster is None:
            self.cluster = ClusterDialog(self.window)
            self.cluster.server_ready.connect(self.on_cluster_ready)
        self.cluster.show()
        self.cluster.raise_()
        return self.cluster

    def on_cluster_ready(self, url: str) -> None:
        """A cluster started from the dialog answers: test and save it like a connection."""
        dialog = self.open_connect(url)
        dialog.test()

    def on_saved(self, conn: Connection) -> None:
        self.refresh()
        if conn.models:
            self.use(remote_path(conn, conn.models[0]))

    def refresh(self) -> None:
        """The picker and the model manager show the saved connections again."""
        self.window.picker.refresh()
        models = self.window.aux.models
        if models is not None:
            models.servers_panel.refresh()

    def wire_models_window(self, models) -> None:
        panel = models.servers_panel
        panel.connect_requested.connect(self.open_connect)
        panel.cluster_requested.connect(self.open_cluster)
        panel.changed.connect(self.window.picker.refresh)

    def shutdown(self) -> None:
        self.source.shutdown()
        if self.cluster is not None:
            self.cluster.cancel()


def install_remote(window) -> RemoteControl:
    control = RemoteControl(window)
    view = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    view.addSeparator()
    for text, slot in (("Connect to a &Server…", lambda: control.open_connect()),
                       ("&Cluster…", control.open_cluster)):
        action = view.addAction(text)
        action.triggered.connect(slot)
    return control
