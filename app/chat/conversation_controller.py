"""The chat window's conversation actions: open, list, search, rename, delete with undo, export,
copy. Plain logic stays in ``Conversations``; this shows it in the sidebar and the view.

``ConversationController(conversations, session, sidebar=, view=, composer=, dialogs=, status=)``
uses only what it is given (``app.chat.controller.ChatController`` keeps what it shares with
the sending controller). ``opened(int conv_id)`` is emitted while a conversation opens, once
its messages are shown (the window brings the chat settings and the composer along).
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QStandardPaths, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QStatusBar

from app.chat.composer import Composer
from app.chat.controller import ChatController
from app.chat.conversation_view import ConversationView
from app.chat.conversations import Conversations
from app.chat.dialogs import Dialogs
from app.chat.markdown import PREVIEW_CHARS
from app.chat.session import ChatSession
from app.chat.sidebar import Sidebar


class ConversationController(ChatController):
    opened = Signal(int)

    def __init__(self, conversations: Conversations, session: ChatSession, *, sidebar: Sidebar,
                 view: ConversationView, composer: Composer, dialogs: Dialogs,
                 status: QStatusBar, parent: QObject | None = None) -> None:
        super().__init__(conversations, session, view=view, composer=composer, dialogs=dialogs,
                         status=status, parent=parent)
        self.sidebar = sidebar
        self.search_matches: dict[int, tuple[int, str]] = {}

    @Slot()
    def refresh_sidebar(self) -> None:
        if self.closed:  # a late search or timer signal after the database was closed
            return
        text = self.sidebar.search.text()
        convs = self.conversations.listing(text)
        self.search_matches = self.conversations.search_matches(text)
        self.sidebar.set_conversations(
            convs, self.current, streaming=self.session.streaming_conversations(),
            snippets={c: snip for c, (_m, snip) in self.search_matches.items()})

    @Slot(int)
    def open_conversation(self, conv_id: int) -> None:
        if conv_id != self.current:
            self.composer.cancel_edit()
        self.conversations.current = conv_id
        self.reload_view()
        self.opened.emit(conv_id)
        self.composer.set_attachments([])
        self.refresh_sidebar()
        match = self.search_matches.get(conv_id)
        if match is not None:
            self.view.show_match(match[0])

    def reload_view(self) -> None:
        """Show the open conversation again (its branch, live replies, attachments)."""
        conv = self.current
        if conv is None:
            self.view.show_conversation(None, [])
            return
        shown = self.conversations.messages(conv, preview=PREVIEW_CHARS + 1)  # not 50 MB pastes
        self.view.show_conversation(conv, shown, self.session.live_messages(conv),
                                    branches=self.conversations.branches(conv),
                                    attachments=self.conversations.attachments(conv))
        self.view.update_actions(busy=self.session.busy)

    def new_chat(self) -> None:
        if not self.conversations.is_empty(self.current):
            self.open_conversation(self.session.new_conversation())
        self.composer.edit.setFocus()

    def ask_rename(self, conv_id: int) -> None:
        conv = self.conversations.get(conv_id)
        if conv is None:
            return
        title = self.dialogs.ask_text("Rename chat", "Title:", conv.title)
        if title is not None and title.strip():
            self.rename_conversation(conv_id, title.strip())

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self.conversations.rename(conv_id, title)
        self.refresh_sidebar()

    def delete_conversation(self, conv_id: int) -> None:
        """Soft-delete with an undo bar; an earlier undoable deletion becomes final."""
        self.session.stop_conversation(conv_id)
        conv = self.conversations.delete(conv_id)
        if conv is None:
            return
        self.sidebar.show_undo(conv.title)
        if self.current is None:
            self.open_conversation(self.conversations.next_after_delete())
        else:
            self.refresh_sidebar()

    def undo_delete(self) -> None:
        cid = self.conversations.undo_delete()
        if cid is not None:
            self.sidebar.hide_undo()
            self.open_conversation(cid)

    def export_folder(self) -> Path:
        """Where the export dialog opens: the folder last exported to, else Documents."""
        last = self.conversations.store.get_setting("export_folder")
        if isinstance(last, str) and Path(last).is_dir():
            return Path(last)
        docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
        return Path(docs) if docs and Path(docs).is_dir() else Path.home()

    def ask_export(self, conv_id: int, fmt: str) -> None:
        name = str(self.export_folder() / self.conversations.export_name(conv_id, fmt))
        path = self.dialogs.ask_save_path("Export chat", name, "Markdown (*.md)"
                                          if fmt == "md" else "JSON (*.json)")
        if path:
            self.export_conversation(conv_id, fmt, path)

    def export_conversation(self, conv_id: int, fmt: str, path: str | Path) -> Path | None:
        """Write the export; a failure (missing folder, no permission, full disk) is shown in
        a dialog and returns None."""
        try:
            out = self.conversations.export(conv_id, fmt, path)
        except OSError as exc:
            why = exc.strerror or str(exc)
            self.dialogs.show_error("Export failed",
                                    f"The chat could not be exported to {path}: {why}.")
            return None
        self.conversations.store.set_setting("export_folder", str(out.resolve().parent))
        self.status.showMessage(f"Exported to {out}", 5000)
        return out

    def export_current(self, fmt: str) -> None:
        if self.current is not None:
            self.ask_export(self.current, fmt)

    def copy_chat(self) -> None:
        """The whole open chat, as Markdown, to the clipboard."""
        if self.conversations.get(self.current) is None:
            return
        QGuiApplication.clipboard().setText(self.conversations.export_text(self.current, "md"))
        self.status.showMessage("Chat copied as Markdown", 3000)

    def focus_search(self) -> None:
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()
