"""``ToolsManager``: the Qt side of the tools — ``mcp.json`` and its error, the ``McpHost``
(started on first need), the tool preferences, and which servers each chat has switched on.

Signals (on the UI thread): ``changed()`` (a server's state, the config or the preferences
changed), ``call_done(conv_id, call_id, CallResult)`` (a call started with ``call`` ended).

A chat's servers are its settings' ``"tools"`` list (saved with the chat); the built-in
``python`` server is one of them like any other. ``catalog_for(conv_id)`` is what the chat
offers the model now (servers still starting contribute nothing yet).
"""
from __future__ import annotations

import concurrent.futures
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal

from app.db import ChatStore
from app.tools import builtin
from app.tools.catalog import Catalog
from app.tools.config import (PREFS_KEY, ConfigError, ServerSpec, ToolPrefs, config_path,
                              load_config, save_config)
from app.tools.host import CallResult, McpHost, ServerState


class ToolsManager(QObject):
    changed = Signal()
    call_done = Signal(int, str, object)
    _host_changed = Signal()
    _result = Signal(int, str, object)

    def __init__(self, store: ChatStore, *, config_file: Path | None = None,
                 log_dir: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        from app.paths import log_dir as default_log_dir

        self.store = store
        self.path = Path(config_file) if config_file else config_path()
        self.specs, self.config_error = load_config(self.path)
        self.prefs = ToolPrefs.from_dict(store.get_setting(PREFS_KEY))
        self.host = McpHost(log_dir=log_dir or default_log_dir(create=False),  # made on use
                            on_change=self._host_changed.emit)
        self.started = False
        q = Qt.ConnectionType.QueuedConnection
        self._host_changed.connect(self.changed, q)
        self._result.connect(self.call_done, q)

    # -- servers ---------------------------------------------------------------------------
    def ensure_started(self) -> None:
        """Start the configured servers (the first time tools are wanted)."""
        if not self.started:
            self.started = True
            self.host.configure(self.specs)

    def states(self) -> dict[str, ServerState]:
        live = self.host.states()
        out = {}
        for name, spec in self.specs.items():
            out[name] = live.get(name) or ServerState(
                name, "disabled" if spec.disabled else "stopped", detail=spec.describe())
        return out

    def config_text(self) -> str:
        try:
            return self.path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            return '{\n  "mcpServers": {}\n}\n'

    def save_config(self, text: str) -> dict[str, ServerSpec]:
        """Validate and save ``text`` (raises ``ConfigError``, nothing saved); the servers follow."""
        try:
            self.specs = save_config(self.path, text)
        except OSError as exc:
            raise ConfigError(f"{self.path} cannot be written: {exc}") from None
        self.config_error = None
        if self.started:
            self.host.configure(self.specs)
        self.changed.emit()
        return self.specs

    def restart(self, name: str) -> None:
        if not self.started:
            self.ensure_started()
        else:
            self.host.restart(name)

    # -- preferences -----------------------------------------------------------------------
    def set_prefs(self, prefs: ToolPrefs) -> None:
        self.prefs = prefs
        self.store.set_setting(PREFS_KEY, prefs.to_dict())
        self.changed.emit()

    def allow_always(self, server: str, tool: str, on: bool = True) -> None:
        self.set_prefs(self.prefs.with_allowed(server, tool, on))

    # -- chats -----------------------------------------------------------------------------
    def chat_servers(self, conv_id: int | None) -> list[str]:
        conv = self.store.conversation(conv_id) if conv_id is not None else None
        names = (conv.settings or {}).get("tools") if conv else None
        if not isinstance(names, list):
            return []
        known = set(self.specs) | {builtin.SERVER}
        return [n for n in names if isinstance(n, str) and n in known]

    def set_chat_servers(self, conv_id: int, names: list[str]) -> None:
        conv = self.store.conversation(conv_id)
        if conv is None:
            return
        self.store.set_conversation_settings(conv_id, {**(conv.settings or {}),
                                                       "tools": list(names)})
        if any(n != builtin.SERVER for n in names):
            self.ensure_started()
        self.changed.emit()

    def catalog_for(self, conv_id: int) -> Catalog:
        servers = self.chat_servers(conv_id)
        if any(n != builtin.SERVER for n in servers):
            self.ensure_started()
        return Catalog.build(servers, self.host.states())

    # -- calls -----------------------------------------------------------------------------
    def call(self, conv_id: int, call_id: str, server: str, tool: str,
             arguments: dict) -> concurrent.futures.Future:
        fut = self.host.call(server, tool, arguments, self.prefs.timeout_s)

        def done(f: concurrent.futures.Future) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            result = f.result() if exc is None else CallResult(f"The call failed: {exc}", True)
            self._result.emit(conv_id, call_id, result)

        fut.add_done_callback(done)
        return fut

    def shutdown(self) -> None:
        self.host.shutdown()
