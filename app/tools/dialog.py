"""The Tools & MCP window: the servers (status, tools, last error, Restart), ``mcp.json`` in a
validating editor (Import from Claude Desktop / LM Studio, Add filesystem server for chosen
folders), and the permissions (call timeout, steps per reply, tools always allowed)."""
from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog,
                               QFormLayout, QHBoxLayout, QLabel, QListWidget, QListWidgetItem,
                               QPlainTextEdit, QPushButton, QSpinBox, QTabWidget, QVBoxLayout,
                               QWidget)

from app.tools import builtin
from app.tools.config import ConfigError, filesystem_server, import_sources, merge_import, parse_config
from app.tools.manager import ToolsManager

STATUS_TEXT = {"ready": "running", "starting": "starting…", "error": "failed",
               "stopped": "not started", "disabled": "disabled"}


class ToolsDialog(QDialog):
    def __init__(self, manager: ToolsManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Tools & MCP Servers")
        self.manager = manager
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self._servers_tab(), "Servers")
        self.tabs.addTab(self._json_tab(), "mcp.json")
        self.tabs.addTab(self._prefs_tab(), "Permissions")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.tabs)
        lay.addWidget(buttons)
        manager.changed.connect(self.refresh)
        manager.ensure_started()
        self.refresh()
        self.resize(760, 520)

    # -- servers ---------------------------------------------------------------------------
    def _servers_tab(self) -> QWidget:
        tab = QWidget(self)
        lay = QHBoxLayout(tab)
        self.server_list = QListWidget(tab)
        self.server_list.setAccessibleName("MCP servers")
        self.server_list.currentRowChanged.connect(lambda _r: self._show_details())
        self.details = QLabel(tab)
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.restart_button = QPushButton("Restart", tab)
        self.restart_button.clicked.connect(self._restart)
        right = QVBoxLayout()
        right.addWidget(self.details, 1)
        right.addWidget(self.restart_button, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.server_list, 2)
        lay.addLayout(right, 3)
        return tab

    def refresh(self) -> None:
        name = self._selected()
        self.server_list.blockSignals(True)
        self.server_list.clear()
        item = QListWidgetItem(f"{builtin.SERVER} (built-in) — running")
        item.setData(Qt.ItemDataRole.UserRole, builtin.SERVER)
        self.server_list.addItem(item)
        for st in self.manager.states().values():
            item = QListWidgetItem(f"{st.name} — {STATUS_TEXT.get(st.status, st.status)}"
                                   + (f", {len(st.tools)} tools" if st.status == "ready" else ""))
            item.setData(Qt.ItemDataRole.UserRole, st.name)
            self.server_list.addItem(item)
        rows = [self.server_list.item(i).data(Qt.ItemDataRole.UserRole)
                for i in range(self.server_list.count())]
        self.server_list.setCurrentRow(rows.index(name) if name in rows else 0)
        self.server_list.blockSignals(False)
        self._show_details()
        self._show_allowed()

    def _selected(self) -> str | None:
        item = self.server_list.currentItem() if hasattr(self, "server_list") else None
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def _show_details(self) -> None:
        name = self._selected()
        if name == builtin.SERVER:
            self.details.setText(f"<b>{builtin.SERVER}</b> — built into MTP Chat<br><br>"
                                 f"<b>{builtin.NAME}</b>(name): {builtin.SPEC['description']}")
            self.restart_button.setEnabled(False)
            return
        st = self.manager.states().get(name or "")
        if st is None:
            self.details.setText(self.manager.config_error or "No MCP server is configured: "
                                 "add one in mcp.json.")
            self.restart_button.setEnabled(False)
            return
        tools = "".join(f"<li><b>{t.name}</b> — {_esc(t.description.splitlines()[0] if t.description else '')}</li>"
                        for t in st.tools)
        err = f"<p style='color:#c0392b'>Last error: {_esc(st.error)}</p>" if st.error else ""
        self.details.setText(f"<b>{_esc(st.name)}</b> — {STATUS_TEXT.get(st.status, st.status)}"
                             f"<br><code>{_esc(st.detail)}</code>{err}"
                             + (f"<ul>{tools}</ul>" if tools else ""))
        self.restart_button.setEnabled(st.status != "disabled")

    def _restart(self) -> None:
        name = self._selected()
        if name and name != builtin.SERVER:
            self.manager.restart(name)

    # -- mcp.json --------------------------------------------------------------------------
    def _json_tab(self) -> QWidget:
        tab = QWidget(self)
        lay = QVBoxLayout(tab)
        note = QLabel(f"{self.manager.path} — the schema LM Studio and Claude Desktop use: "
                      "\"command\", \"args\", \"env\" (stdio) or \"url\", \"headers\" (HTTP).", tab)
        note.setObjectName("muted")
        note.setWordWrap(True)
        self.editor = QPlainTextEdit(tab)
        self.editor.setObjectName("textInput")
        self.editor.setAccessibleName("mcp.json")
        self.editor.setPlainText(self.manager.config_text())
        self.editor.textChanged.connect(self.validate)
        self.json_status = QLabel(tab)
        self.json_status.setWordWrap(True)
        row = QHBoxLayout()
        self.import_buttons = []
        for label, path in import_sources():
            b = QPushButton(f"Import from {label}", tab)
            b.setToolTip(f"Add the servers of {path} (that file is only read)")
            b.clicked.connect(lambda _=False, p=path: self.import_from(p))
            row.addWidget(b)
            self.import_buttons.append(b)
        if not self.import_buttons:
            none = QLabel("No Claude Desktop or LM Studio MCP file on this machine.", tab)
            none.setObjectName("muted")
            row.addWidget(none)
        fs = QPushButton("Add filesystem server…", tab)
        fs.setToolTip("The official filesystem server, allowed only into a folder you choose")
        fs.clicked.connect(self.ask_filesystem)
        row.addWidget(fs)
        row.addStretch(1)
        self.save_button = QPushButton("Save", tab)
        self.save_button.clicked.connect(self.save)
        row.addWidget(self.save_button)
        lay.addWidget(note)
        lay.addWidget(self.editor, 1)
        lay.addWidget(self.json_status)
        lay.addLayout(row)
        self.validate()
        return tab

    def validate(self) -> bool:
        try:
            specs = parse_config(self.editor.toPlainText())
        except ConfigError as exc:
            self.json_status.setText(f"⚠ {exc}")
            self.save_button.setEnabled(False)
            return False
        self.json_status.setText(f"Valid: {len(specs)} server(s).")
        self.save_button.setEnabled(True)
        return True

    def save(self) -> None:
        try:
            self.manager.save_config(self.editor.toPlainText())
        except ConfigError as exc:
            self.json_status.setText(f"⚠ {exc}")
            return
        self.json_status.setText("Saved; the servers were started again as needed.")

    def import_from(self, path) -> None:
        try:
            text, added = merge_import(self.editor.toPlainText(), path)
        except (ConfigError, ValueError) as exc:
            self.json_status.setText(f"⚠ Cannot import: {exc}")
            return
        self.editor.setPlainText(text)
        self.json_status.setText(f"Added {', '.join(added) or 'nothing new'} from {path.name}: "
                                 "check and Save.")

    def ask_filesystem(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder the filesystem server may use")
        if folder:
            self.add_filesystem([folder])

    def add_filesystem(self, folders: list[str]) -> None:
        try:
            data = json.loads(self.editor.toPlainText() or "{}")
            data.setdefault("mcpServers", {})["filesystem"] = filesystem_server(folders)
        except (ValueError, AttributeError, ConfigError) as exc:
            self.json_status.setText(f"⚠ {exc}")
            return
        self.editor.setPlainText(json.dumps(data, indent=2, ensure_ascii=False) + "\n")

    # -- permissions -----------------------------------------------------------------------
    def _prefs_tab(self) -> QWidget:
        tab = QWidget(self)
        form = QFormLayout(tab)
        prefs = self.manager.prefs
        self.timeout = QDoubleSpinBox(tab)
        self.timeout.setRange(1, 3600)
        self.timeout.setSuffix(" s")
        self.timeout.setValue(prefs.timeout_s)
        self.steps = QSpinBox(tab)
        self.steps.setRange(1, 100)
        self.steps.setValue(prefs.max_steps)
        self.timeout.valueChanged.connect(self._save_prefs)
        self.steps.valueChanged.connect(self._save_prefs)
        self.allowed = QListWidget(tab)
        self.allowed.setAccessibleName("Tools always allowed")
        forget = QPushButton("Ask again for the selected tool", tab)
        forget.clicked.connect(self._forget)
        form.addRow("A tool call gives up after", self.timeout)
        form.addRow("Tool steps per reply, at most", self.steps)
        form.addRow("Always allowed (run without asking)", self.allowed)
        form.addRow("", forget)
        return tab

    def _save_prefs(self) -> None:
        from dataclasses import replace

        self.manager.set_prefs(replace(self.manager.prefs, timeout_s=self.timeout.value(),
                                       max_steps=self.steps.value()))

    def _show_allowed(self) -> None:
        self.allowed.clear()
        for server, tools in sorted(self.manager.prefs.always_allow.items()):
            for tool in tools:
                item = QListWidgetItem(f"{server} › {tool}")
                item.setData(Qt.ItemDataRole.UserRole, (server, tool))
                self.allowed.addItem(item)

    def _forget(self) -> None:
        item = self.allowed.currentItem()
        if item is not None:
            server, tool = item.data(Qt.ItemDataRole.UserRole)
            self.manager.allow_always(server, tool, on=False)


def _esc(text: str) -> str:
    import html

    return html.escape(text or "")
