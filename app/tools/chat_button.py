"""The tools in the chat window: ``install(window)`` makes the ``ToolsManager`` and the
``ToolLoop``, adds the composer's per-chat "Tools" switch (a menu of the built-in tools and
the MCP servers, saved with the chat), the File › "Tools & MCP Servers…" window, and shows a
malformed ``mcp.json`` as one line in the status bar (the app starts anyway)."""
from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QMainWindow, QMenu, QToolButton

from app.tools import builtin
from app.tools.loop import ToolLoop
from app.tools.manager import ToolsManager

BUILTIN_LABEL = "Python docs (built-in python_doc)"


class ToolsControl(QObject):
    def __init__(self, window: QMainWindow, manager: ToolsManager | None = None) -> None:
        super().__init__(window)
        self.window = window
        self.manager = manager or ToolsManager(window.store, parent=self)
        self.loop = ToolLoop(window.session, self.manager, self)
        window.view.tool_decider = self.loop
        window.view.tool_example_requested.connect(self.send_with_builtin)
        self.loop.changed.connect(self.on_loop_changed)
        self.button = QToolButton(window.composer)
        self.button.setObjectName("composerToggle")
        self.button.setCheckable(True)
        self.button.setAccessibleName("Tools for this chat")
        self.button.setToolTip("Tools the model may call in this chat (each call asks you first)")
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu = QMenu(self.button)
        self.menu.aboutToShow.connect(self.fill_menu)
        self.button.setMenu(self.menu)
        window.composer.chip_row.insertWidget(2, self.button)  # after Attach and Think
        self.manager.changed.connect(self.sync)
        window.chats.opened.connect(lambda _conv: self.sync())
        self.dialog = None
        self.closed = False
        self.notice = QLabel("", window)  # a malformed mcp.json, in one line, until fixed
        self.notice.setObjectName("errorText")
        self.notice.setAccessibleName("MCP configuration problem")
        window.statusBar().addPermanentWidget(self.notice)
        self.sync()

    @property
    def current(self) -> int | None:
        return self.window.conversations.current

    def servers(self) -> list[tuple[str, str]]:
        """(name, label) of every server a chat can switch on."""
        states = self.manager.states()
        out = [(builtin.SERVER, BUILTIN_LABEL)]
        for name, st in states.items():
            extra = "" if st.status == "ready" else f" ({st.status})"
            out.append((name, f"{name}{extra}"))
        return out

    def fill_menu(self) -> None:
        self.menu.clear()
        chosen = set(self.manager.chat_servers(self.current))
        for name, label in self.servers():
            a = QAction(label, self.menu)
            a.setCheckable(True)
            a.setChecked(name in chosen)
            a.toggled.connect(lambda on, n=name: self.set_server(n, on))
            self.menu.addAction(a)
        self.menu.addSeparator()
        manage = QAction("Tools && MCP Servers…", self.menu)
        manage.triggered.connect(self.show_dialog)
        self.menu.addAction(manage)

    def set_server(self, name: str, on: bool) -> None:
        if self.current is None:
            return
        names = [n for n in self.manager.chat_servers(self.current) if n != name]
        self.manager.set_chat_servers(self.current, names + ([name] if on else []))
        self.sync()

    def send_with_builtin(self, text: str) -> None:
        """An example prompt that needs the built-in tool: switch it on for this chat (the
        Tools chip shows it), then send as typed. The call still waits for the user's Allow."""
        if self.current is None:
            return
        if builtin.SERVER not in self.manager.chat_servers(self.current):
            self.set_server(builtin.SERVER, True)
        self.window.sending.send(text)

    def sync(self) -> None:
        if self.closed:
            return
        error = self.manager.config_error or ""
        self.notice.setText(f"⚠ {error}" if error else "")
        self.notice.setToolTip("Fix it in File › Tools & MCP Servers…" if error else "")
        self.notice.setVisible(bool(error))
        n = len(self.manager.chat_servers(self.current))
        self.button.setText(f"Tools ({n})" if n else "Tools")
        self.button.setChecked(bool(n))

    def on_loop_changed(self, conv_id: int) -> None:
        if self.closed:
            return
        if conv_id == self.current:
            self.window.chats.reload_view()
        self.window.sending.sync_composer()

    def show_dialog(self):
        from app.tools.dialog import ToolsDialog

        if self.dialog is None:
            self.dialog = ToolsDialog(self.manager, self.window)
        self.dialog.show()
        self.dialog.raise_()
        return self.dialog

    def shutdown(self) -> None:
        self.loop.cancel_all()
        self.closed = True
        self.manager.shutdown()


def install(window: QMainWindow, manager: ToolsManager | None = None) -> ToolsControl:
    control = ToolsControl(window, manager)
    file_menu = window.menuBar().actions()[0].menu()
    action = QAction("&Tools && MCP Servers…", window)
    action.triggered.connect(control.show_dialog)
    file_menu.insertAction(file_menu.actions()[-2], action)  # above Quit's separator
    return control
