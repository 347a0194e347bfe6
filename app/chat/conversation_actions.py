"""Conversation-list actions of the main window: new, rename, delete with undo, export, search.

A mixin for ``app.main_window.MainWindow`` (it uses the window's ``store``, ``session``,
``sidebar``, ``composer`` and ``open_conversation``); kept apart so the window stays short.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QInputDialog

from app.chat.export import to_json, to_markdown


class ConversationActions:
    def new_chat(self) -> None:
        if self.current_conv is not None and not self.store.messages(self.current_conv):
            self.composer.edit.setFocus()
            return
        self.open_conversation(self.session.new_conversation())
        self.composer.edit.setFocus()

    def ask_rename(self, conv_id: int) -> None:
        conv = self.store.conversation(conv_id)
        if conv is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=conv.title)
        if ok and title.strip():
            self.rename_conversation(conv_id, title.strip())

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self.store.rename_conversation(conv_id, title)
        self.refresh_sidebar()

    def delete_conversation(self, conv_id: int) -> None:
        """Soft-delete with an undo bar; an earlier undoable deletion becomes final."""
        conv = self.store.conversation(conv_id)
        if conv is None:
            return
        for st in list(self.session.streams.values()):
            if st.conv_id == conv_id:
                self.session.stop()
        self.store.purge_deleted()
        self.store.delete_conversation(conv_id)
        self._last_deleted = conv_id
        self.sidebar.show_undo(conv.title)
        if conv_id == self.current_conv:
            rest = self.store.conversations()
            self.current_conv = None
            self.open_conversation(rest[0].id if rest else self.session.new_conversation())
        else:
            self.refresh_sidebar()

    def undo_delete(self) -> None:
        if self._last_deleted is None:
            return
        self.store.undelete_conversation(self._last_deleted)
        cid, self._last_deleted = self._last_deleted, None
        self.sidebar.hide_undo()
        self.open_conversation(cid)

    def ask_export(self, conv_id: int, fmt: str) -> None:
        conv = self.store.conversation(conv_id)
        if conv is None:
            return
        ext = "md" if fmt == "md" else "json"
        safe = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conv.title).strip() or "chat"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{safe}.{ext}",
                                              "Markdown (*.md)" if ext == "md" else "JSON (*.json)")
        if path:
            self.export_conversation(conv_id, fmt, path)

    def _export_current(self, fmt: str) -> None:
        if self.current_conv is not None:
            self.ask_export(self.current_conv, fmt)

    def export_conversation(self, conv_id: int, fmt: str, path: str | Path) -> Path:
        conv = self.store.conversation(conv_id)
        msgs = self.store.messages(conv_id)
        text = to_markdown(conv, msgs) if fmt == "md" else to_json(conv, msgs)
        out = Path(path)
        out.write_text(text, encoding="utf-8")
        self.statusBar().showMessage(f"Exported to {out}", 5000)
        return out

    def copy_chat(self) -> None:
        """The whole open chat, as Markdown, to the clipboard."""
        conv = self.store.conversation(self.current_conv) if self.current_conv else None
        if conv is None:
            return
        QGuiApplication.clipboard().setText(to_markdown(conv, self.store.messages(conv.id)))
        self.statusBar().showMessage("Chat copied as Markdown", 3000)

    def focus_search(self) -> None:
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()
