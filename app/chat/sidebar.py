"""Conversation list: newest use first, search over titles and text, rename, delete with undo,
export. Reads through ``ChatStore``; user intents leave as signals.

Signals: ``conversation_selected(int)``, ``new_requested()``, ``rename_requested(int)``,
``delete_requested(int)``, ``export_requested(int, str fmt)`` ("md" or "json"),
``undo_requested()``.
"""
from __future__ import annotations

import time

from PySide6.QtCore import QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from app.chat.layout import box_layout, native_shortcut
from app.db import Conversation

UNDO_SECONDS = 10
SUBTITLE_ROLE = Qt.ItemDataRole.UserRole + 1


def relative_time(ts: float, now: float | None = None) -> str:
    d = (now or time.time()) - ts
    if d < 60:
        return "just now"
    if d < 3600:
        return f"{int(d // 60)} min ago"
    if d < 86400:
        return f"{int(d // 3600)} h ago"
    if d < 7 * 86400:
        return f"{int(d // 86400)} d ago"
    return time.strftime("%Y-%m-%d", time.localtime(ts))


class ConversationDelegate(QStyledItemDelegate):
    """Two lines per chat: the title, and a muted "when · writing…" line."""

    PAD = 6

    def sizeHint(self, option, index) -> QSize:  # noqa: N802 - Qt override
        fm = option.fontMetrics
        return QSize(option.rect.width(), 2 * fm.height() + 2 * self.PAD + 2)

    def paint(self, painter, option, index) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        style = opt.widget.style() if opt.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        pal = option.palette
        role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        title_color = pal.color(role)
        r = option.rect.adjusted(self.PAD + 2, self.PAD, -self.PAD, -self.PAD)
        fm = option.fontMetrics
        painter.save()
        painter.setPen(title_color)
        title = fm.elidedText(index.data(Qt.ItemDataRole.DisplayRole) or "",
                              Qt.TextElideMode.ElideRight, r.width())
        painter.drawText(QRect(r.left(), r.top(), r.width(), fm.height()), Qt.AlignmentFlag.AlignLeft, title)
        small = painter.font()
        small.setPointSizeF(max(6.0, small.pointSizeF() * 0.88))
        painter.setFont(small)
        sub = index.data(SUBTITLE_ROLE) or ""
        muted = title_color if selected else pal.color(QPalette.ColorRole.PlaceholderText)
        painter.setPen(muted)
        painter.drawText(QRect(r.left(), r.top() + fm.height() + 2, r.width(), fm.height()),
                         Qt.AlignmentFlag.AlignLeft, sub)
        painter.restore()


class Sidebar(QWidget):
    conversation_selected = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int)
    delete_requested = Signal(int)
    export_requested = Signal(int, str)
    undo_requested = Signal()
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumWidth(170)
        lay = box_layout(QVBoxLayout, self, margins=(8, 8, 4, 8), spacing=6)
        self.new_button = QPushButton("New chat", self)
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip(f"New chat ({native_shortcut(QKeySequence.StandardKey.New)})")
        self.new_button.clicked.connect(self.new_requested)
        lay.addWidget(self.new_button)
        self.search = QLineEdit(self)
        self.search.setPlaceholderText(
            f"Search chats ({native_shortcut(QKeySequence.StandardKey.Find)})")
        self.search.setAccessibleName("Search chats")
        self.search.setObjectName("textInput")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self, singleShot=True, interval=150)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.search.text()))
        self.search.textChanged.connect(lambda _t: self._search_timer.start())
        lay.addWidget(self.search)
        self.list = QListWidget(self)
        self.list.setAccessibleName("Conversations")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.setItemDelegate(ConversationDelegate(self.list))
        self.list.setUniformItemSizes(True)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        lay.addWidget(self.list, 1)
        self.no_matches = QLabel("No matches", self)
        self.no_matches.setObjectName("muted")
        self.no_matches.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.no_matches.setWordWrap(True)
        self.no_matches.setAccessibleName("Search result")
        self.no_matches.hide()
        lay.addWidget(self.no_matches)
        self._build_undo_bar(lay)
        self._building = False
        delete = QAction("Delete chat", self.list, shortcut=QKeySequence.StandardKey.Delete,
                         shortcutContext=Qt.ShortcutContext.WidgetShortcut)
        delete.triggered.connect(self._delete_current)
        self.list.addAction(delete)
        rename = QAction("Rename chat", self.list, shortcut=QKeySequence("F2"),
                         shortcutContext=Qt.ShortcutContext.WidgetShortcut)
        rename.triggered.connect(lambda: self._with_current(self.rename_requested.emit))
        self.list.addAction(rename)

    def _build_undo_bar(self, lay: QVBoxLayout) -> None:
        self.undo_bar = QFrame(self)
        self.undo_bar.setObjectName("undoBar")
        ul = QHBoxLayout(self.undo_bar)
        ul.setContentsMargins(8, 4, 4, 4)
        self.undo_label = QLabel("", self.undo_bar)
        self.undo_label.setWordWrap(True)
        self.undo_button = QPushButton("Undo", self.undo_bar)
        self.undo_button.setAccessibleName("Undo delete")
        self.undo_button.clicked.connect(self.undo_requested)
        ul.addWidget(self.undo_label, 1)
        ul.addWidget(self.undo_button)
        self.undo_bar.hide()
        self._undo_timer = QTimer(self, singleShot=True, interval=UNDO_SECONDS * 1000)
        self._undo_timer.timeout.connect(self.undo_bar.hide)
        lay.addWidget(self.undo_bar)

    def show_undo(self, title: str) -> None:
        self.undo_label.setText(f"Deleted “{title}”.")
        self.undo_bar.show()
        self._undo_timer.start()

    def hide_undo(self) -> None:
        self._undo_timer.stop()
        self.undo_bar.hide()

    def set_conversations(self, convs: list[Conversation], current: int | None,
                          *, streaming: set[int] = frozenset(),
                          snippets: dict[int, str] | None = None) -> None:
        """``snippets``: while searching, the matching text to show under each title."""
        self._building = True
        searching = bool(self.search.text().strip())
        self.no_matches.setText(f"No matches for “{self.search.text().strip()}”")
        self.no_matches.setVisible(searching and not convs)
        try:
            self.list.clear()
            now = time.time()
            for c in convs:
                when = relative_time(c.updated_at, now)
                item = QListWidgetItem(c.title)
                sub = f"writing… · {when}" if c.id in streaming else when
                if snippets and c.id in snippets:
                    sub = snippets[c.id]
                    item.setToolTip(f"{c.title}\n{sub}")
                item.setData(SUBTITLE_ROLE, sub)
                item.setData(Qt.ItemDataRole.UserRole, c.id)
                if not item.toolTip():
                    item.setToolTip(c.title)
                self.list.addItem(item)
                if c.id == current:
                    self.list.setCurrentItem(item)
        finally:
            self._building = False

    def ids(self) -> list[int]:
        return [self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count())]

    def select(self, conv_id: int) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.ItemDataRole.UserRole) == conv_id:
                self.list.setCurrentRow(i)
                return

    def _on_current(self, item: QListWidgetItem | None, _prev) -> None:
        if item is not None and not self._building:
            self.conversation_selected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _with_current(self, fn) -> None:
        item = self.list.currentItem()
        if item is not None:
            fn(item.data(Qt.ItemDataRole.UserRole))

    def _delete_current(self) -> None:
        self._with_current(self.delete_requested.emit)

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_requested.emit(cid))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete_requested.emit(cid))
        menu.exec(self.list.viewport().mapToGlobal(pos))
