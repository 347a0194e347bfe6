"""The model manager's "Servers" tab: saved connections to servers elsewhere (an MTP Chat
server, one machine or a cluster, or any OpenAI-compatible endpoint).

Signals: ``load_requested(str path)`` (chat with a served model: its ``remote_path``),
``changed()`` (a connection was added or removed), ``connect_requested()`` and
``cluster_requested()`` (the buttons that open those dialogs)."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.remote.connections import ConnectionStore, remote_path

KIND_NAMES = {"mtp": "MTP Chat", "openai": "OpenAI-compatible"}


class ServersPanel(QWidget):
    load_requested = Signal(str)
    changed = Signal()
    connect_requested = Signal()
    cluster_requested = Signal()

    def __init__(self, parent: QWidget | None = None, *,
                 store: ConnectionStore | None = None) -> None:
        super().__init__(parent)
        self.store = store or ConnectionStore()
        lay = QVBoxLayout(self)
        note = QLabel("Models served by other machines. Their replies stream into the chat; an "
                      "MTP Chat server's speculation stats reach the dashboard.")
        note.setWordWrap(True)
        note.setObjectName("muted")
        lay.addWidget(note)
        self.table = QTableWidget(0, 4, self)
        self.table.setHorizontalHeaderLabels(["Server", "Kind", "Models", "API key"])
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.doubleClicked.connect(lambda _i: self.use_selected())
        lay.addWidget(self.table, 1)
        row = QHBoxLayout()
        for text, slot in (("Connect to a server…", self.connect_requested.emit),
                           ("Cluster…", self.cluster_requested.emit),
                           ("Chat with it", self.use_selected), ("Remove", self.remove_selected)):
            b = QPushButton(text)
            b.clicked.connect(slot)
            row.addWidget(b)
        row.addStretch(1)
        lay.addLayout(row)
        self.refresh()

    def refresh(self) -> None:
        self.rows = self.store.load()
        self.table.setRowCount(len(self.rows))
        for i, c in enumerate(self.rows):
            for j, text in enumerate((c.host, KIND_NAMES.get(c.kind, c.kind),
                                      ", ".join(c.models), "••••••" if c.api_key else "none")):
                self.table.setItem(i, j, QTableWidgetItem(text))
        self.table.resizeColumnToContents(0)
        self.table.resizeColumnToContents(1)

    def selected(self):
        i = self.table.currentRow()
        return self.rows[i] if 0 <= i < len(self.rows) else None

    def use_selected(self) -> None:
        c = self.selected()
        if c is not None and c.models:
            self.load_requested.emit(remote_path(c, c.models[0]))

    def remove_selected(self) -> None:
        c = self.selected()
        if c is None:
            return
        try:
            self.store.remove(c.base_url)
        except OSError:
            return
        self.refresh()
        self.changed.emit()
