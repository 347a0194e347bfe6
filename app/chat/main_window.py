"""The main chat window: sidebar | model picker + conversation + composer | chat settings.

Wiring only: the window builds the widgets and composes controllers, each constructed with
exactly what it uses, and connects signals to them:

- ``chats``: ``app.chat.conversation_controller.ConversationController`` (open, list, search,
  rename, delete, export, copy);
- ``sending``: ``app.chat.sending_controller.SendingController`` (send, edit, regenerate,
  branches, stop, what streams);
- ``chat_settings``: ``app.chat.settings_controller.ChatSettingsController`` (the settings
  panel, the Think switch, presets);
- ``dialogs``: ``app.chat.dialogs.Dialogs`` (the dialogs they ask for, parented to the window).

Conversation operations live in ``app.chat.conversations.Conversations``, streaming in
``app.chat.session.ChatSession``, the model every view shows in ``app.loaded_model.LoadedModel``,
the engine in ``app.worker.Worker`` (its own thread), rendering in ``app.chat.*`` widgets. The
window itself keeps the model loading and tuning, the appearance, and the lifecycle.
Construct with ``loader`` (default ``engine.load``) and ``db_file`` to run over a fake engine or
another database (tests, the bench); ``autoload=False`` skips loading a model at start.
"""
from __future__ import annotations

import gc
from importlib import metadata
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QTimer, Slot
from PySide6.QtGui import QAction, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.chat.aux_windows import AuxWindows
from app.chat.composer import Composer
from app.chat.conversation_controller import ConversationController
from app.chat.conversation_view import ConversationView
from app.chat.conversations import Conversations
from app.chat.dialogs import Dialogs
from app.chat.layout import box_layout
from app.chat.markdown import highlight_html
from app.chat.model_picker import ModelPicker
from app.chat.notices import DataNotice, message_label, show_store_notice, show_text
from app.chat.sending_controller import SendingController
from app.chat.session import ChatSession
from app.chat.settings_controller import ChatSettingsController
from app.chat.settings_dialog import AppPreferences, ChatSettingsPanel, DefaultsDialog
from app.chat.sidebar import Sidebar
from app.chat.theme import apply_app_style, apply_theme
from app.db import open_chat_store
from app.loaded_model import LoadedModel
from app.remote.connections import is_remote
from app.remote.install import install_remote
from app.paths import db_path, default_model_path
from app.server_control import ServerControl
from app.server_control import install as install_server
from app.tools.chat_button import install as install_tools
from app.window_state import fit_to_screen, restore_geometry, save_geometry
from app.worker import Loader, WorkerThread
from engine import __version__ as engine_version
from engine.types import ModelInfo


def _warm_up_highlighter() -> None:
    """Load a Pygments lexer while idle, not in the middle of the first streamed reply."""
    highlight_html("x = 1", "python", dark=False)
    _freeze_heap()


def _freeze_heap() -> None:
    """Move everything allocated so far (modules, the tokenizer, widgets) out of the cyclic
    GC's reach: full collections over it took 20-65 ms, long enough to stutter a stream."""
    gc.collect()
    gc.freeze()


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def about_text() -> str:
    """The About box: name, version, what it does, the MLX and mlx-lm versions, a credit."""
    return (f"<h3>MTP Chat</h3><p>Version {engine_version}</p>"
            "<p>Chat with language models on your own Mac, faster through exact "
            "multi-token-prediction (MTP) speculative decoding: the model drafts several tokens "
            "ahead and keeps only those it would have written anyway.</p>"
            f"<p>MLX {_package_version('mlx')} · mlx-lm {_package_version('mlx-lm')}</p>"
            "<p>Built on Apple's MLX and mlx-lm, and Qt for Python (PySide6).</p>")


DEFAULT_SIZE = (1180, 760)
CHAT_MIN_WIDTH = 360   # the chat column never gets narrower (the side panels give way)
CHAT_READABLE = 480    # what opening the settings panel leaves it, where the window allows  # within a 1280×800 screen's available area
DEMO_EXAMPLES = ("What does `os.path.join` do?", "How do I use itertools.chain?",
                 "Explain str.split.")


# A name the demo model was never trained on (engine.training.tool_chats.TOOL_HELDOUT): with
# the tool on, it calls python_doc, asks first, and answers from the result (the retrained
# demo of 2026-12-06 does so word for word greedily and at 10 of 10 seeds of the chat's
# defaults; for queue.LifoQueue, the example before, it repeated a line at 6 of 10).
DEMO_TOOL_EXAMPLES = ("What does `codecs.getwriter` do?",)
DEMO_TOOL_INTRO = ("It was not trained on most of the library, but with the built-in python_doc "
                   "tool it looks names up in the Python this app runs on:")


def _is_demo(info) -> bool:
    try:
        return Path(info.path).resolve() == Path(default_model_path()).resolve()
    except (OSError, TypeError):
        return False


def _examples_for(info) -> tuple[str, list[str]]:
    """The empty conversation's hint: the embedded demo model says what it knows."""
    if not _is_demo(info):
        return "", []
    return ("The demo model knows the docstrings of everyday Python standard-library modules "
            "and little else. Try:", list(DEMO_EXAMPLES))


def _tool_examples_for(info) -> dict:
    """The demo's tool examples (``set_examples``' keywords), none for other models or for a
    demo trained without tool chats (no ``heldout_tools.json`` beside its weights)."""
    if not _is_demo(info) or not (Path(info.path) / "heldout_tools.json").is_file():
        return {}
    return {"tool_prompts": list(DEMO_TOOL_EXAMPLES), "tool_intro": DEMO_TOOL_INTRO}


class MainWindow(QMainWindow):
    def __init__(self, model_path: str | None = None, *, loader: Loader | None = None,
                 db_file: str | Path | None = None, autoload: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("MTP Chat")
        self._closed = False
        self._restyling = False
        self._sidebar_width = 0  # the sidebar's width before the settings panel narrowed it
        self.store, self.store_notice = open_chat_store(
            (lambda: Path(db_file)) if db_file else db_path)
        self.conversations = Conversations(self.store)
        self.prefs = AppPreferences.from_dict(self.conversations.preferences())
        self.worker_thread = WorkerThread(loader=loader)
        self.worker = self.worker_thread.worker
        self.model = LoadedModel(self)
        self.model.attach(self.worker)
        self.session = ChatSession(self.conversations, self.worker, self.model, self)
        self._build_ui()
        self._build_controllers()
        self._build_menus()
        self._connect()
        for conv_id, text in self.store.problems:  # found while opening the store
            self.on_store_problem(conv_id, text)
        self.store.on_problem = self.on_store_problem
        self.aux = AuxWindows(self, self.worker, self.model, on_load=self.load_model,
                              on_tune=self.tune_model, store=self.store)
        self.server = ServerControl(self.worker, self.model, self.store, self)
        install_server(self, self.server)
        self.tools = install_tools(self)
        self.remote = install_remote(self)  # models served elsewhere
        self.aux.on_models_window = self.remote.wire_models_window
        self._help_menu_last()
        fit_to_screen(self, DEFAULT_SIZE)
        restore_geometry(self.store, "main", self)
        self.apply_preferences(self.prefs)
        self.chat_settings.load_presets()
        show_store_notice(self, self.storage_banner, self.store_notice)
        QApplication.styleHints().colorSchemeChanged.connect(self.on_color_scheme_changed)
        self.chats.open_conversation(self.conversations.start())
        if autoload:
            self.load_model(model_path or self._initial_model())
        QTimer.singleShot(200, _warm_up_highlighter)

    @property
    def current_conv(self) -> int | None:
        return self.conversations.current

    # -- construction ----------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.sidebar = Sidebar(self)
        self.picker = ModelPicker(self)
        self.view = ConversationView(self)
        self.view.full_loader = self._full_text
        self.chat_area = self.view  # the shell's name for it
        self.composer = Composer(self)
        self.settings_panel = ChatSettingsPanel(self)
        self.settings_panel.hide()
        self.banner = message_label(self, "Model message")
        self.storage_banner = message_label(self, "Chat storage message")
        self.settings_button = QPushButton("Chat settings", self)
        self.settings_button.setCheckable(True)
        self.settings_button.setAccessibleName("Show chat settings")
        self.settings_button.toggled.connect(self.settings_panel.setVisible)
        self.settings_button.toggled.connect(self.fit_panes)
        pane = QWidget(self)
        pane.setMinimumWidth(CHAT_MIN_WIDTH)  # the splitter narrows the side panels first
        pl = box_layout(QVBoxLayout, pane, margins=(0, 8, 0, 0), spacing=4)
        header = box_layout(QHBoxLayout, margins=(16, 0, 12, 0))
        header.addWidget(self.picker, 1)
        header.addWidget(self.settings_button)
        pl.addLayout(header)
        pl.addWidget(self.storage_banner)
        pl.addWidget(self.banner)
        pl.addWidget(self.view, 1)
        pl.addWidget(self.composer)
        self.splitter = QSplitter(self)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(pane)
        self.splitter.addWidget(self.settings_panel)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([250, 900, 300])
        self.setCentralWidget(self.splitter)
        self.statusBar().setAccessibleName("Status")
        # a lasting, dismissable line naming chats with damaged values
        self.data_notice_box = DataNotice(self)
        self.data_notice = self.data_notice_box.label
        self.statusBar().addPermanentWidget(self.data_notice_box)

    def fit_panes(self, panel_open: bool = True) -> None:
        """The settings panel just opened: give it a quarter of the width (at most 320 px,
        at least its minimum) and keep the chat column at least ``CHAT_READABLE`` wide,
        narrowing the sidebar (to its minimum) before the panel. Closed: the sidebar gets
        back the width it had."""
        sp = self.splitter
        total = sp.width() - sp.handleWidth() * 2
        side, panel = self.sidebar, self.settings_panel
        if not panel_open:
            if self._sidebar_width > side.width():
                side_w = min(self._sidebar_width, max(side.width(), total - CHAT_READABLE))
                sp.setSizes([side_w, total - side_w, 0])
            return
        self._sidebar_width = max(self._sidebar_width, side.width())
        panel_w = max(panel.minimumWidth(), min(320, total // 4))
        side_w = max(side.minimumWidth(), min(side.width(), total - panel_w - CHAT_READABLE))
        chat_w = total - side_w - panel_w
        if chat_w < CHAT_READABLE:
            panel_w = max(panel.minimumWidth(), total - side_w - CHAT_READABLE)
            chat_w = total - side_w - panel_w
        sp.setSizes([side_w, chat_w, panel_w])

    def _build_controllers(self) -> None:
        self.dialogs = Dialogs(self)
        status = self.statusBar()
        self.chats = ConversationController(
            self.conversations, self.session, sidebar=self.sidebar, view=self.view,
            composer=self.composer, dialogs=self.dialogs, status=status, parent=self)
        self.sending = SendingController(
            self.conversations, self.session, self.model, chats=self.chats, view=self.view,
            composer=self.composer, dialogs=self.dialogs, status=status, parent=self)
        self.chat_settings = ChatSettingsController(
            self.conversations, self.store, self.model, panel=self.settings_panel,
            composer=self.composer, parent=self)

    def _build_menus(self) -> None:
        mb = self.menuBar()
        chats, sending = self.chats, self.sending
        file_menu = mb.addMenu("&File")
        self.new_action = self._action(file_menu, "&New Chat", chats.new_chat,
                                       QKeySequence.StandardKey.New)
        self._action(file_menu, "Export as &Markdown…", lambda: chats.export_current("md"))
        self._action(file_menu, "Export as &JSON…", lambda: chats.export_current("json"))
        file_menu.addSeparator()
        self._action(file_menu, "&Settings…", self.open_defaults, QKeySequence("Ctrl+,"))
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        edit_menu = mb.addMenu("&Edit")
        self._action(edit_menu, "&Find Chats", chats.focus_search, QKeySequence.StandardKey.Find)
        self._action(edit_menu, "&Copy Chat as Markdown", chats.copy_chat,
                     QKeySequence("Ctrl+Shift+C"))
        self.stop_action = self._action(edit_menu, "&Stop Generating", sending.stop, None)
        view = mb.addMenu("&View")
        self.tint_action = self._action(view, "Show &Speculation", self.toggle_tint,
                                        QKeySequence("Ctrl+Shift+T"))
        self.tint_action.setCheckable(True)
        self._action(view, "Chat S&ettings Panel", self.settings_button.toggle,
                     QKeySequence("Ctrl+Shift+S"))
        view.addSeparator()
        self._action(view, "&Dashboard…", lambda: self.aux.show_dashboard(), QKeySequence("Ctrl+Shift+D"))
        self._action(view, "&Models…", lambda: self.aux.show_models(), QKeySequence("Ctrl+Shift+M"))
        self.help_menu = mb.addMenu("&Help")
        self._action(self.help_menu, "&About MTP Chat", self.show_about)
        esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        esc.activated.connect(sending.on_escape)

    def _help_menu_last(self) -> None:
        """File, Edit, View, Server, Help: menus added after ours (the server's) go before Help."""
        mb, action = self.menuBar(), self.help_menu.menuAction()
        mb.removeAction(action)
        mb.addAction(action)

    def _action(self, menu, text: str, slot, shortcut=None) -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(shortcut)
        a.triggered.connect(slot)
        menu.addAction(a)
        return a

    def _connect(self) -> None:
        """Every signal of the session, the model, the worker and the widgets to its slot."""
        s, w, chats, sending = self.session, self.worker, self.chats, self.sending
        settings = self.chat_settings
        sb, c, v, p = self.sidebar, self.composer, self.view, self.settings_panel
        for signal, slot in (
                (s.stream_updated, sending.on_stream_updated),
                (s.stream_finished, sending.on_stream_finished),
                (s.busy_changed, sending.on_busy_changed),
                (s.conversations_changed, chats.refresh_sidebar),
                (s.messages_changed, sending.on_messages_changed),
                (s.storage_failed, self.show_storage_message),
                (s.storage_recovered, lambda: self.show_storage_message(
                    self.store_notice.message if self.store_notice else "")),
                (self.model.changed, self.on_model_changed),
                (self.model.status_changed, self.on_model_status),
                (w.tune_progress, self.on_tune_progress),
                (w.tune_finished, self.on_tune_finished),
                (w.tune_failed, self.on_tune_failed),
                # an opened chat: its settings, and the composer's state there
                (chats.opened, settings.show),
                (chats.opened, lambda _conv: sending.sync_composer()),
                (sb.conversation_selected, chats.open_conversation),
                (sb.new_requested, chats.new_chat),
                (sb.rename_requested, chats.ask_rename),
                (sb.delete_requested, chats.delete_conversation),
                (sb.undo_requested, chats.undo_delete),
                (sb.export_requested, chats.ask_export),
                (sb.search_changed, lambda _t: chats.refresh_sidebar()),
                (c.send_requested, sending.send),
                (c.stop_requested, sending.stop),
                (c.attachments_changed, sending.on_attachments_changed),
                (c.thinking_toggled, settings.set_thinking),
                (v.edit_requested, sending.begin_edit),
                (v.regenerate_requested, sending.regenerate),
                (v.branch_requested, sending.switch_branch),
                (v.example_requested, sending.send),
                (self.picker.load_requested, self.load_model),
                (p.settings_changed, settings.on_chat_settings_changed),
                (p.reset_requested, settings.reset_chat_settings),
                (p.preset_saved, settings.save_preset),
                (p.preset_deleted, settings.delete_preset)):
            signal.connect(slot)

    def _initial_model(self) -> str:
        last = self.conversations.last_model()
        if last and (self.remote.knows(last) if is_remote(last) else Path(last).exists()):
            return last
        return str(default_model_path())

    # -- models ------------------------------------------------------------------------------
    def load_model(self, path: str) -> None:
        path = str(path)
        if is_remote(path):
            self.remote.use(path)
            return
        if not Path(path).exists():
            demo = Path(path) == default_model_path()
            msg = (f"The embedded demo model is missing ({path}). Build it with "
                   "`python -m engine train-demo`, or open a model with View › Models…"
                   if demo else f"Model folder not found: {path}")
            self.model.on_load_failed(msg)
            return
        if self.session.busy:
            self.session.stop()
        self.model.begin(path, f"Loading {Path(path).name}…")
        self.worker.load_model(path)

    def tune_model(self, path: str) -> None:
        if self.session.busy:
            self.session.stop()
        self.statusBar().showMessage("Tuning the speculation depth…")
        self.worker.start_tune(path)

    @Slot(object)
    def on_model_changed(self, info: ModelInfo | None) -> None:
        if self._closed or info is None:  # (queued signals can arrive after shutdown)
            return
        self.view.model_name = info.name
        self.settings_panel.form.set_model_info(info)
        self.conversations.remember_model(info.path)
        self.chat_settings.sync_thinking()
        self.statusBar().showMessage(f"Loaded {info.name}", 5000)
        QTimer.singleShot(0, _freeze_heap)

    @Slot()
    def on_model_status(self) -> None:
        """The picker, the banner, the example prompts and the composer follow the model."""
        if self._closed:
            return
        m = self.model
        if m.loading_path is not None:
            self.picker.set_loading(m.loading_path, m.progress_text)
            self.view.set_examples("", [])
        elif m.info is not None:
            self.picker.set_loaded(m.info)
            self.view.set_examples(*_examples_for(m.info), **_tool_examples_for(m.info))
        else:
            self.picker.set_failed("Not loaded")
            self.view.set_examples("", [])
        show_text(self.banner, m.error)
        self.sending.sync_composer()

    @Slot(int, int, str)
    def on_tune_progress(self, done: int, total: int, message: str) -> None:
        if self._closed:  # queued signals can arrive after shutdown
            return
        self.statusBar().showMessage(f"Tuning {done}/{total}: {message}")

    @Slot(object)
    def on_tune_finished(self, result) -> None:
        if self._closed:  # queued signals can arrive after shutdown
            return
        text = getattr(result, "message", None) or str(result)
        self.statusBar().showMessage(f"Tuning finished: {text}", 15000)

    @Slot(str)
    def on_tune_failed(self, message: str) -> None:
        if self._closed:  # queued signals can arrive after shutdown
            return
        self.statusBar().showMessage(f"Tuning failed: {message}", 15000)

    # -- appearance ----------------------------------------------------------------------------
    def open_defaults(self) -> None:
        dlg = DefaultsDialog(self.conversations.defaults, self.prefs, self.model.info, self)
        if dlg.exec():
            self.conversations.set_defaults(dlg.defaults())
            self.conversations.set_preferences(dlg.preferences().__dict__)
            self.apply_preferences(dlg.preferences())
            self.settings_panel.set_defaults(self.conversations.defaults)

    def apply_preferences(self, prefs: AppPreferences) -> None:
        self.prefs = prefs
        apply_theme(prefs.theme)
        if prefs.font_size:
            font = QApplication.font()
            font.setPointSize(prefs.font_size)
            self.setFont(font)
        self.view.tint = prefs.show_speculation
        self.tint_action.setChecked(prefs.show_speculation)
        self.restyle()

    def toggle_tint(self) -> None:
        prefs = AppPreferences(self.prefs.theme, self.prefs.font_size, self.tint_action.isChecked())
        self.conversations.set_preferences(prefs.__dict__)
        self.prefs = prefs
        self.view.tint = prefs.show_speculation
        self.chats.reload_view()

    def restyle(self) -> None:
        """Re-derive the chat colours from the palette and re-render (code colours change)."""
        if self._restyling:
            return
        self._restyling = True
        try:
            apply_app_style()
            self.chats.reload_view()
        finally:
            self._restyling = False
        self._sidebar_width = 0  # the sidebar's width before the settings panel narrowed it

    @Slot(Qt.ColorScheme)
    def on_color_scheme_changed(self, _scheme) -> None:
        if self.prefs.theme == "system":
            apply_theme("system")
            self.restyle()

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.Type.ApplicationPaletteChange and not self._restyling:
            self.restyle()

    # -- lifecycle -----------------------------------------------------------------------------
    def show_about(self) -> None:
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About MTP Chat", about_text(),
                          QMessageBox.StandardButton.Ok, self)
        for b in box.buttons():  # a plain OK, as on a Mac: no stock tick icon
            b.setIcon(QIcon())
        box.exec()

    def _full_text(self, msg_id: int) -> str:
        """A message's whole text (the view reads only the start of a long one)."""
        msg = self.conversations.message(msg_id)
        return msg.content if msg is not None else ""

    def on_store_problem(self, _conv_id: int | None, text: str) -> None:
        """A bad value in the chat database was ignored (``ChatStore.note_problem`` logged
        it with the file): say which chat in the status bar, without interrupting."""
        self.data_notice_box.add(text)

    @Slot(str)
    def show_storage_message(self, text: str) -> None:
        """The chat-storage banner above the conversation (empty text hides it)."""
        show_text(self.storage_banner, text)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Save streaming replies, stop the worker thread, close the database. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.chats.closed = self.sending.closed = True
        self.tools.shutdown()
        self.session.shutdown()
        self.server.shutdown()
        self.remote.shutdown()
        self.worker_thread.shutdown()
        save_geometry(self.store, "main", self)
        self.aux.close_all()
        self.conversations.close()
