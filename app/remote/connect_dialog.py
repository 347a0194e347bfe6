"""The "Connect to a server…" dialog: an address, an optional API key (masked), "Test
connection" (``GET /v1/models`` on a thread: the server's models, or one line saying what is
wrong), then Save: the connection is kept (``ConnectionStore``) and its models appear in the
model picker. Signal ``saved(Connection)``."""
from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit,
                               QListWidget, QPushButton, QVBoxLayout, QWidget)

from app.remote.connections import Connection, ConnectionStore, RemoteError, probe

KINDS = {"mtp": "MTP Chat server: replies carry speculation stats",
         "openai": "OpenAI-compatible server: tok/s only, no MTP stats"}


class Probe(QObject):
    """Runs ``probe`` on a thread; ``done(result)``: a ``Connection`` or the error's line.
    Not parented: it lives until its thread ends, even when the dialog is gone first."""

    done = Signal(object)

    def start(self, url: str, key: str) -> None:
        def run() -> None:
            try:
                result: object = probe(url, key)
            except RemoteError as exc:
                result = str(exc)
            self.done.emit(result)
        threading.Thread(target=run, daemon=True, name="probe-server").start()


class ConnectDialog(QDialog):
    saved = Signal(object)

    def __init__(self, parent: QWidget | None = None, *, store: ConnectionStore | None = None,
                 url: str = "", api_key: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle("Connect to a server")
        self.store = store or ConnectionStore()
        self.found: Connection | None = None
        self._probes: list[Probe] = []
        lay = QVBoxLayout(self)
        intro = QLabel("Chat with a model served by another machine: an MTP Chat server "
                       "(<code>python -m engine serve</code>, one machine or a cluster) or any "
                       "OpenAI-compatible endpoint.")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        form = QFormLayout()
        self.url = QLineEdit(url)
        self.url.setPlaceholderText("http://192.168.1.20:8080")
        self.url.setAccessibleName("Server address")
        self.key = QLineEdit(api_key)
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("optional")
        self.key.setAccessibleName("API key")
        form.addRow("Server address", self.url)
        form.addRow("API key", self.key)
        lay.addLayout(form)
        self.test_button = QPushButton("Test connection")
        self.test_button.clicked.connect(self.test)
        lay.addWidget(self.test_button)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Connection status")
        lay.addWidget(self.status)
        self.models = QListWidget()
        self.models.setAccessibleName("The server's models")
        lay.addWidget(self.models, 1)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        self.save_button.setEnabled(False)
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        for field in (self.url, self.key):
            field.textEdited.connect(self._edited)
        self.resize(520, 420)

    def _edited(self) -> None:
        self.found = None
        self.save_button.setEnabled(False)

    def test(self) -> None:
        self._edited()
        self.models.clear()
        self.status.setText("Testing…")
        self.test_button.setEnabled(False)
        p = Probe()
        p.done.connect(self.on_probed)
        self._probes.append(p)
        p.start(self.url.text(), self.key.text().strip())

    @Slot(object)
    def on_probed(self, result: object) -> None:
        self.test_button.setEnabled(True)
        if isinstance(result, str):
            self.status.setText(f"✗ {result}")
            return
        self.found = result
        self.status.setText(f"✓ {result.host}: {KINDS[result.kind]} · "
                            f"{len(result.models)} model{'s' if len(result.models) != 1 else ''}")
        self.models.addItems(list(result.models))
        self.save_button.setEnabled(True)

    def save(self) -> None:
        if self.found is None:
            return
        try:
            self.store.add(self.found)
        except OSError as exc:
            self.status.setText(f"✗ Cannot save the connection: {exc}")
            return
        self.saved.emit(self.found)
        self.accept()
