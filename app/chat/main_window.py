"""The main chat window: sidebar | model picker + conversation + composer | chat settings.

Wiring only: conversation operations live in ``app.chat.conversations.Conversations``,
streaming in ``app.chat.session.ChatSession``, the model every view shows in
``app.loaded_model.LoadedModel``, the engine in ``app.worker.Worker`` (its own thread),
rendering in ``app.chat.*`` widgets. The window shows dialogs and forwards their answers.
Construct with ``loader`` (default ``engine.load``) and ``db_file`` to run over a fake engine or
another database (tests, the bench); ``autoload=False`` skips loading a model at start.
"""
from __future__ import annotations

import gc
import logging
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QTimer, Slot
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import __version__
from app.chat.aux_windows import AuxWindows
from app.chat.composer import Composer
from app.chat.conversation_view import ConversationView
from app.chat.conversations import Conversations
from app.chat.markdown import highlight_html
from app.chat.model_picker import ModelPicker
from app.chat.session import ChatSession
from app.chat.settings import ChatSettings
from app.chat.settings_dialog import AppPreferences, ChatSettingsPanel, DefaultsDialog
from app.chat.sidebar import Sidebar
from app.chat.window_conversations import ConversationActions
from app.chat.window_sending import SendingActions
from app.chat.theme import apply_app_style, apply_theme
from app.db import StoreNotice, open_chat_store
from app.loaded_model import LoadedModel
from app.paths import db_path, default_model_path
from app.server_control import ServerControl, install as install_server
from app.window_state import fit_to_screen, restore_geometry, save_geometry
from app.worker import Loader, WorkerThread
from engine.types import ModelInfo

log = logging.getLogger(__name__)


def _warm_up_highlighter() -> None:
    """Load a Pygments lexer while idle, not in the middle of the first streamed reply."""
    highlight_html("x = 1", "python", dark=False)
    _freeze_heap()


def _freeze_heap() -> None:
    """Move everything allocated so far (modules, the tokenizer, widgets) out of the cyclic
    GC's reach: full collections over it took 20-65 ms, long enough to stutter a stream."""
    gc.collect()
    gc.freeze()


DEFAULT_SIZE = (1180, 760)  # within a 1280×800 screen's available area
DEMO_EXAMPLES = ("What does `os.path.join` do?", "How do I use itertools.chain?",
                 "Explain str.split.")


def _examples_for(info) -> tuple[str, list[str]]:
    """The empty conversation's hint: the embedded demo model says what it knows."""
    try:
        demo = Path(info.path).resolve() == Path(default_model_path()).resolve()
    except (OSError, TypeError):
        demo = False
    if not demo:
        return "", []
    return ("The demo model knows the docstrings of everyday Python standard-library modules "
            "and little else. Try:", list(DEMO_EXAMPLES))


class MainWindow(ConversationActions, SendingActions, QMainWindow):
    def __init__(self, model_path: str | None = None, *, loader: Loader | None = None,
                 db_file: str | Path | None = None, autoload: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("MTP Chat")
        self._closed = False
        self._restyling = False
        self.search_matches: dict[int, tuple[int, str]] = {}
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
        self._build_menus()
        self._connect()
        for conv_id, text in self.store.problems:  # found while opening the store
            self.on_store_problem(conv_id, text)
        self.store.on_problem = self.on_store_problem
        self.aux = AuxWindows(self, self.worker, self.model, on_load=self.load_model,
                              on_tune=self.tune_model, store=self.store)
        self.server = ServerControl(self.worker, self.model, self.store, self)
        install_server(self, self.server)
        fit_to_screen(self, DEFAULT_SIZE)
        restore_geometry(self.store, "main", self)
        self.apply_preferences(self.prefs)
        self.settings_panel.set_presets(self.store.presets())
        self._show_store_notice(self.store_notice)
        QApplication.styleHints().colorSchemeChanged.connect(self.on_color_scheme_changed)
        self.open_conversation(self.conversations.start())
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
        self.banner = QLabel("", self)
        self.banner.setObjectName("errorText")
        self.banner.setWordWrap(True)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner.setAccessibleName("Model message")
        self.banner.hide()
        self.storage_banner = QLabel("", self)
        self.storage_banner.setObjectName("errorText")
        self.storage_banner.setWordWrap(True)
        self.storage_banner.setAccessibleName("Chat storage message")
        self.storage_banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.storage_banner.hide()
        self.settings_button = QPushButton("Chat settings", self)
        self.settings_button.setCheckable(True)
        self.settings_button.setAccessibleName("Show chat settings")
        self.settings_button.toggled.connect(self.settings_panel.setVisible)
        pane = QWidget(self)
        pl = QVBoxLayout(pane)
        pl.setContentsMargins(0, 8, 0, 0)
        pl.setSpacing(4)
        header = QHBoxLayout()
        header.setContentsMargins(16, 0, 12, 0)
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
        self._build_data_notice()

    def _build_data_notice(self) -> None:
        """A lasting, dismissable line in the status bar naming chats with damaged values."""
        box = QWidget(self)
        hl = QHBoxLayout(box)
        hl.setContentsMargins(0, 0, 0, 0)
        hl.setSpacing(2)
        self.data_notice = QLabel("", box)
        self.data_notice.setObjectName("errorText")
        self.data_notice.setAccessibleName("Damaged chat data")
        close = QToolButton(box)
        close.setObjectName("msgAction")
        close.setText("×")
        close.setAccessibleName("Dismiss the damaged chat data notice")
        close.clicked.connect(box.hide)
        hl.addWidget(self.data_notice)
        hl.addWidget(close)
        box.hide()
        self.data_notice_box = box
        self.data_notices: list[str] = []
        self.statusBar().addPermanentWidget(box)

    def _build_menus(self) -> None:
        mb = self.menuBar()
        file_menu = mb.addMenu("&File")
        self.new_action = self._action(file_menu, "&New Chat", self.new_chat, QKeySequence.StandardKey.New)
        self._action(file_menu, "Export as &Markdown…", lambda: self._export_current("md"))
        self._action(file_menu, "Export as &JSON…", lambda: self._export_current("json"))
        file_menu.addSeparator()
        self._action(file_menu, "&Settings…", self.open_defaults, QKeySequence("Ctrl+,"))
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        edit_menu = mb.addMenu("&Edit")
        self._action(edit_menu, "&Find Chats", self.focus_search, QKeySequence.StandardKey.Find)
        self._action(edit_menu, "&Copy Chat as Markdown", self.copy_chat, QKeySequence("Ctrl+Shift+C"))
        self.stop_action = self._action(edit_menu, "&Stop Generating", self.stop, None)
        view = mb.addMenu("&View")
        self.tint_action = self._action(view, "Show &Speculation", self.toggle_tint,
                                        QKeySequence("Ctrl+Shift+T"))
        self.tint_action.setCheckable(True)
        self._action(view, "Chat S&ettings Panel", self.settings_button.toggle,
                     QKeySequence("Ctrl+Shift+S"))
        view.addSeparator()
        self._action(view, "&Dashboard…", lambda: self.aux.show_dashboard(), QKeySequence("Ctrl+Shift+D"))
        self._action(view, "&Models…", lambda: self.aux.show_models(), QKeySequence("Ctrl+Shift+M"))
        help_menu = mb.addMenu("&Help")
        self._action(help_menu, "&About MTP Chat", self.show_about)
        esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        esc.activated.connect(self.on_escape)

    def _action(self, menu, text: str, slot, shortcut=None) -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(shortcut)
        a.triggered.connect(slot)
        menu.addAction(a)
        return a

    def _connect(self) -> None:
        s = self.session
        s.stream_updated.connect(self.on_stream_updated)
        s.stream_finished.connect(self.on_stream_finished)
        s.busy_changed.connect(self.on_busy_changed)
        s.conversations_changed.connect(self.refresh_sidebar)
        s.messages_changed.connect(self.on_messages_changed)
        s.storage_failed.connect(self.show_storage_message)
        s.storage_recovered.connect(lambda: self.show_storage_message(
            self.store_notice.message if self.store_notice else ""))
        self.model.changed.connect(self.on_model_changed)
        self.model.status_changed.connect(self.on_model_status)
        w = self.worker
        w.tune_progress.connect(self.on_tune_progress)
        w.tune_finished.connect(self.on_tune_finished)
        w.tune_failed.connect(self.on_tune_failed)
        sb = self.sidebar
        sb.conversation_selected.connect(self.open_conversation)
        sb.new_requested.connect(self.new_chat)
        sb.rename_requested.connect(self.ask_rename)
        sb.delete_requested.connect(self.delete_conversation)
        sb.undo_requested.connect(self.undo_delete)
        sb.export_requested.connect(self.ask_export)
        sb.search_changed.connect(lambda _t: self.refresh_sidebar())
        self.composer.send_requested.connect(self.on_send)
        self.composer.stop_requested.connect(self.stop)
        self.view.edit_requested.connect(self.begin_edit)
        self.view.regenerate_requested.connect(self.regenerate)
        self.view.branch_requested.connect(self.switch_branch)
        self.composer.attach_failed.connect(lambda text: self.show_error("Cannot attach", text))
        self.composer.attachments_changed.connect(self.on_attachments_changed)
        self.view.example_requested.connect(self.on_send)
        self.picker.load_requested.connect(self.load_model)
        self.settings_panel.settings_changed.connect(self.on_chat_settings_changed)
        self.settings_panel.reset_requested.connect(self.reset_chat_settings)
        self.settings_panel.preset_saved.connect(self.save_preset)
        self.settings_panel.preset_deleted.connect(self.delete_preset)
        self.composer.thinking_toggled.connect(self.set_thinking)

    def _initial_model(self) -> str:
        last = self.conversations.last_model()
        if last and Path(last).exists():
            return last
        return str(default_model_path())

    # -- models ------------------------------------------------------------------------------
    def load_model(self, path: str) -> None:
        path = str(path)
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
        self.sync_thinking()
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
            self.view.set_examples(*_examples_for(m.info))
        else:
            self.picker.set_failed("Not loaded")
            self.view.set_examples("", [])
        self.banner.setText(m.error)
        self.banner.setVisible(bool(m.error))
        self._sync_composer()

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

    # -- settings and appearance ---------------------------------------------------------------
    def on_chat_settings_changed(self, settings: ChatSettings) -> None:
        if self.current_conv is not None:
            self.conversations.set_settings(self.current_conv, settings)
        self.sync_thinking()

    def sync_thinking(self) -> None:
        """The composer's Think switch shows this chat's setting and the model's ability."""
        if self.current_conv is None:
            return
        info = self.model.info
        able = info is None or bool(getattr(info, "supports_thinking", False))
        self.composer.set_thinking(self.conversations.settings_for(self.current_conv).thinking,
                                   available=able)

    def set_thinking(self, on: bool) -> None:
        if self.current_conv is None:
            return
        settings = replace(self.conversations.settings_for(self.current_conv), thinking=on)
        self.conversations.set_settings(self.current_conv, settings)
        self.settings_panel.form.set_settings(settings)

    def save_preset(self, name: str, prompt: str) -> None:
        self.store.save_preset(name, prompt)
        self.settings_panel.set_presets(self.store.presets())

    def delete_preset(self, name: str) -> None:
        if name:
            self.store.delete_preset(name)
            self.settings_panel.set_presets(self.store.presets())

    def reset_chat_settings(self) -> None:
        if self.current_conv is not None:
            self.settings_panel.form.set_settings(
                self.conversations.reset_settings(self.current_conv))

    def open_defaults(self) -> None:
        dlg = DefaultsDialog(self.conversations.defaults, self.prefs, self.model.info, self)
        if dlg.exec():
            self.conversations.set_defaults(dlg.defaults())
            self.conversations.set_preferences(dlg.preferences().__dict__)
            self.apply_preferences(dlg.preferences())

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
        self._reload_view()

    def restyle(self) -> None:
        """Re-derive the chat colours from the palette and re-render (code colours change)."""
        if self._restyling:
            return
        self._restyling = True
        try:
            apply_app_style()
            self._reload_view()
        finally:
            self._restyling = False

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
        QMessageBox.about(self, "About MTP Chat",
                          f"MTP Chat {__version__}\n\nLocal chat with exact multi-token-prediction "
                          "speculative decoding.")

    def _show_store_notice(self, notice: StoreNotice | None) -> None:
        """A damaged or unwritable chat database: a lasting banner, and for a recovery a
        dialog saying where the old file was kept (non-blocking: the app stays usable)."""
        if notice is None:
            return
        log.warning("chat database: %s", notice.message)
        self.show_storage_message(notice.message)
        if notice.kind == "recovered":
            box = QMessageBox(QMessageBox.Icon.Warning, "Chat history recovered", notice.message,
                              QMessageBox.StandardButton.Ok, self)
            box.setObjectName("storeNoticeDialog")
            QTimer.singleShot(0, box.open)

    def _full_text(self, msg_id: int) -> str:
        """A message's whole text (the view reads only the start of a long one)."""
        msg = self.conversations.message(msg_id)
        return msg.content if msg is not None else ""

    def on_store_problem(self, _conv_id: int | None, text: str) -> None:
        """A bad value in the chat database was ignored (``ChatStore.note_problem`` logged
        it with the file): say which chat in the status bar, without interrupting."""
        self.data_notices.append(text)
        more = len(self.data_notices) - 1
        line = self.data_notices[0] + (f" (and {more} more)" if more else "")
        fm = self.data_notice.fontMetrics()
        self.data_notice.setText(fm.elidedText(line, Qt.TextElideMode.ElideMiddle, 640))
        self.data_notice.setToolTip("\n".join(self.data_notices) + "\n\nDetails are in the log.")
        self.data_notice_box.show()

    @Slot(str)
    def show_storage_message(self, text: str) -> None:
        """The chat-storage banner above the conversation (empty text hides it)."""
        self.storage_banner.setText(text)
        self.storage_banner.setVisible(bool(text))

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Save streaming replies, stop the worker thread, close the database. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.session.shutdown()
        self.server.shutdown()
        self.worker_thread.shutdown()
        save_geometry(self.store, "main", self)
        self.aux.close_all()
        self.conversations.close()
