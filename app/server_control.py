"""The app's "Local server" switch: serve the model the chat has loaded over the engine's
OpenAI/Anthropic routes (``engine.server``) on 127.0.0.1, sharing the worker's scheduler.

The chat's replies and the server's requests queue in the same FIFO (the worker's
``Scheduler``) and decode together, as rows of one batch, on the worker thread, so they never
race for the model; a cancel from any client ends its request within one cycle.

Pieces (logic apart from widgets, as in the rest of the app):
- ``ServerSettings``: the preference (on at start, port, optional API key, web origins
  allowed to call it from a browser; none by default), stored as the ``local_server`` app
  setting. The server refuses every other web page (``engine.server.guard``).
- ``ServerControl`` (QObject, GUI thread): starts and stops ``engine.server.runner.Server``
  over ``worker.scheduler``; follows the ``LoadedModel`` (starts once a model is loaded,
  serves the next one after a switch, cancels its requests when a load begins); ``changed()`` whenever ``state`` / ``error`` / ``requests``
  change. States: "off", "waiting" (on, no model loaded yet), "serving", "stopping",
  "error" (``error`` says why, e.g. the port is in use). Turning it off drains in the
  background (in-flight requests get ``DRAIN_S`` seconds, then are cancelled) and frees the
  port; ``shutdown()`` (the app quitting) stops it at once and waits.
- ``ServerIndicator``: the status-bar toggle, "Serving on http://127.0.0.1:8080 · 2 requests".
- ``ServerDialog``: the preference dialog (Server › Server Settings…).
- ``install(window, control)``: adds the Server menu and the indicator to a main window.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, replace

from PySide6.QtCore import QObject, QTimer, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
    QMainWindow, QSpinBox, QToolButton, QVBoxLayout, QWidget,
)

from app.loaded_model import LoadedModel
from app.worker import Worker

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
SETTING_KEY = "local_server"
CLIENT = "server"       # the scheduler client name of the server's requests
POLL_MS = 300           # how often the request count is re-read while serving
DRAIN_S = 5.0           # turning the switch off: how long in-flight requests may finish


@dataclass(frozen=True)
class ServerSettings:
    enabled: bool = False   # serve whenever a model is loaded (also at the next start)
    port: int = 8080
    api_key: str = ""
    allow_origins: tuple[str, ...] = ()  # browser front-ends (CORS), e.g. http://localhost:3000

    @classmethod
    def from_dict(cls, d: dict | None) -> ServerSettings:
        d = d if isinstance(d, dict) else {}
        try:
            port = int(d.get("port", 8080))
        except (TypeError, ValueError):
            port = 8080
        from engine.server.guard import parse_origins

        origins = d.get("allow_origins")
        return cls(enabled=bool(d.get("enabled", False)),
                   port=port if 1 <= port <= 65535 else 8080,
                   api_key=str(d.get("api_key") or ""),
                   allow_origins=parse_origins(origins if isinstance(origins, list) else ()))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


class ServerControl(QObject):
    """See the module docstring. ``store`` needs ``get_setting``/``set_setting`` (ChatStore)."""

    changed = Signal()
    _stopped = Signal(object)  # from the background stopper: the Server that stopped

    def __init__(self, worker: Worker, model: LoadedModel, store=None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.worker = worker
        self.model = model
        self.store = store
        self.settings = ServerSettings.from_dict(
            store.get_setting(SETTING_KEY) if store is not None else None)
        self.server = None      # engine.server.runner.Server while serving
        self.state = "off"
        self.error = ""
        self.requests = 0
        self._stoppers: list[threading.Thread] = []
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self.on_poll)
        self._stopped.connect(self.on_stopped)
        model.changed.connect(self.on_model_changed)
        model.status_changed.connect(self.on_model_status)
        if self.settings.enabled:
            self._start()

    # -- queries -------------------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return self.state == "serving"

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else self.settings.url

    def status_text(self) -> str:
        if self.state == "serving":
            n = self.requests
            return f"Serving on {self.url} · {n} request{'' if n == 1 else 's'}"
        return {"waiting": "Local server: waiting for a model…",
                "stopping": "Local server: stopping…",
                "error": "Local server: failed to start"}.get(self.state, "Local server: off")

    # -- actions ---------------------------------------------------------------------------------
    def set_enabled(self, on: bool) -> None:
        """The switch: remember the choice, then start or stop."""
        self._save(replace(self.settings, enabled=bool(on)))
        if on and self.state == "stopping":
            return  # on_stopped starts it again once the port is free
        if on:
            self._start()
        else:
            self._stop(drain_s=DRAIN_S)

    def apply(self, settings: ServerSettings) -> None:
        """New preferences: saved; a running server moves to the new port/key."""
        old = self.settings
        self._save(settings)
        running = self.server is not None
        moved = (settings.port, settings.api_key, settings.allow_origins) != \
            (old.port, old.api_key, old.allow_origins)
        if running and moved:
            self._stop(drain_s=0.0, wait=True)
        if settings.enabled and self.server is None:
            self._start()
        elif not settings.enabled and running:
            self._stop(drain_s=DRAIN_S)

    def shutdown(self) -> None:
        """The app is quitting: stop serving now and wait (the preference is kept). Every
        request is cancelled first, so none waits behind a reply that would still run."""
        self.worker.scheduler.cancel_all()
        self._stop(drain_s=0.0, wait=True)
        for t in self._stoppers:
            t.join(20)
        self._timer.stop()

    # -- internals -------------------------------------------------------------------------------
    def _save(self, settings: ServerSettings) -> None:
        self.settings = settings
        if self.store is not None:
            try:
                self.store.set_setting(SETTING_KEY, settings.to_dict())
            except Exception as exc:  # noqa: BLE001 - a full disk must not break the switch
                log.error("cannot save the local server setting: %s", exc)

    def _start(self) -> None:
        if self.server is not None:
            return
        if self.model.info is None:
            self._set_state("waiting")
            return
        from engine.server.guard import Perimeter
        from engine.server.runner import Server, ServerStartError

        try:
            self.server = Server(self.worker.scheduler, host=HOST, port=self.settings.port,
                                 api_key=self.settings.api_key or None, shared=True,
                                 drain_s=DRAIN_S, perimeter=Perimeter(
                                     allow_origins=self.settings.allow_origins)
                                 ).start(timeout=15)
        except Exception as exc:  # noqa: BLE001 - nothing escapes a slot; the bar says why
            if not isinstance(exc, (ServerStartError, OSError, ValueError)):
                log.exception("the local server did not start")
            log.warning("the local server did not start: %s", exc)
            self.server = None
            self._set_state("error", str(exc))
            return
        log.info("serving %s on %s", self.model.info.name, self.server.url)
        self.requests = 0
        self._timer.start()
        self._set_state("serving")

    def _stop(self, *, drain_s: float, wait: bool = False) -> None:
        server, self.server = self.server, None
        self._timer.stop()
        self.requests = 0
        if server is None:
            self._set_state("off")
            return
        if wait:
            server.stop(drain_s=drain_s)
            self._set_state("off")
            return
        self._set_state("stopping")

        def stop() -> None:
            try:
                server.stop(drain_s=drain_s)
            finally:
                self._stopped.emit(server)
        t = threading.Thread(target=stop, name="mtp-server-stop", daemon=True)
        self._stoppers.append(t)
        t.start()

    def _set_state(self, state: str, error: str = "") -> None:
        self.state, self.error = state, error
        self.changed.emit()

    # -- slots -------------------------------------------------------------------------------------
    @Slot(object)
    def on_stopped(self, _server) -> None:
        self._stoppers = [t for t in self._stoppers if t.is_alive()]
        if self.state == "stopping":
            self._set_state("off")
        if self.settings.enabled and self.server is None:  # switched on again meanwhile
            self._start()

    @Slot(object)
    def on_model_changed(self, info) -> None:
        """Serve the newly loaded model (same port, no restart). A model served elsewhere
        is not this server's: it keeps serving the worker's model."""
        if info is None or info.layout == "remote":
            return
        if self.server is not None:
            self.server.backend.info = info
            log.info("the local server now serves %s", info.name)
        elif self.settings.enabled and self.state in ("waiting", "off", "error"):
            self._start()

    @Slot()
    def on_model_status(self) -> None:
        """Another model is being loaded: end the server's requests (as the chat's reply is
        stopped), so the load does not wait behind them."""
        if self.model.loading_path is not None:
            self.worker.scheduler.cancel_all(CLIENT)

    @Slot()
    def on_poll(self) -> None:
        n = self.worker.scheduler.count(CLIENT)
        if n != self.requests:
            self.requests = n
            self.changed.emit()


class ServerIndicator(QWidget):
    """The status-bar switch and its text; a click toggles the server."""

    def __init__(self, control: ServerControl, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.control = control
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 4, 0)
        self.button = QToolButton(self)
        self.button.setCheckable(True)
        self.button.setAutoRaise(True)
        self.button.setAccessibleName("Local server")
        self.button.clicked.connect(control.set_enabled)
        self.error_label = QLabel("", self)
        self.error_label.setObjectName("errorText")
        self.error_label.setStyleSheet("color: #c0392b;")
        self.error_label.setAccessibleName("Local server error")
        self.error_label.hide()
        lay.addWidget(self.error_label)
        lay.addWidget(self.button)
        control.changed.connect(self.refresh)
        self.refresh()

    @Slot()
    def refresh(self) -> None:
        c = self.control
        self.button.setText(c.status_text())
        self.button.setChecked(c.state in ("serving", "waiting"))
        self.button.setToolTip(
            f"OpenAI- and Anthropic-compatible API at {c.settings.url}/v1 for other programs, "
            "sharing the chat's model. Click to turn it "
            f"{'off' if self.button.isChecked() else 'on'}.")
        self.error_label.setText(c.error)
        self.error_label.setVisible(bool(c.error))


class ServerDialog(QDialog):
    """Server › Server Settings…: port, API key, allowed web origins, on at start."""

    def __init__(self, settings: ServerSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Local server")
        self.setAccessibleName("Local server settings")
        lay = QVBoxLayout(self)
        note = QLabel("Serves the chat's model to other programs (the openai and anthropic "
                      f"clients, coding agents) on {HOST} only. Chat replies and server "
                      "requests decode together on the model, up to 8 at once.", self)
        note.setWordWrap(True)
        lay.addWidget(note)
        form = QFormLayout()
        self.enabled = QCheckBox("Serve whenever a model is loaded", self)
        self.enabled.setChecked(settings.enabled)
        self.port = QSpinBox(self, minimum=1, maximum=65535)
        self.port.setValue(settings.port)
        self.port.setAccessibleName("Port")
        self.api_key = QLineEdit(settings.api_key, self)
        self.api_key.setPlaceholderText("optional: clients must then send it")
        self.api_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.api_key.setAccessibleName("API key")
        self.origins = QLineEdit(", ".join(settings.allow_origins), self)
        self.origins.setPlaceholderText("none: web pages may not call it (e.g. "
                                        "http://localhost:3000 for Open WebUI)")
        self.origins.setAccessibleName("Allowed web origins")
        form.addRow("Local server", self.enabled)
        form.addRow("Port", self.port)
        form.addRow("API key", self.api_key)
        form.addRow("Allowed web origins", self.origins)
        lay.addLayout(form)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel, self)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)

    def settings(self) -> ServerSettings:
        from engine.server.guard import parse_origins

        return ServerSettings(enabled=self.enabled.isChecked(), port=self.port.value(),
                              api_key=self.api_key.text().strip(),
                              allow_origins=parse_origins([self.origins.text()]))


def install(window: QMainWindow, control: ServerControl) -> ServerIndicator:
    """The Server menu (switch, settings) and the status-bar indicator of ``window``."""
    menu = window.menuBar().addMenu("Se&rver")
    toggle = QAction("&Local Server", window)
    toggle.setCheckable(True)
    toggle.triggered.connect(control.set_enabled)
    menu.addAction(toggle)
    prefs = QAction("Server &Settings…", window)
    menu.addAction(prefs)

    def ask() -> None:
        dlg = ServerDialog(control.settings, window)
        if dlg.exec():
            control.apply(dlg.settings())
    prefs.triggered.connect(ask)

    def sync() -> None:
        toggle.setChecked(control.state in ("serving", "waiting"))
    control.changed.connect(sync)
    sync()
    indicator = ServerIndicator(control, window)
    window.statusBar().addPermanentWidget(indicator)
    window.server_action = toggle
    return indicator
