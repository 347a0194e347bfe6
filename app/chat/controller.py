"""What the chat window's conversation and sending controllers share: the conversations and the
session they act on, the view and the composer that show them, the dialogs and the status bar
they speak through, and ``closed`` (set when the window shuts down: late queued signals are then
ignored)."""
from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QStatusBar

from app.chat.composer import Composer
from app.chat.conversation_view import ConversationView
from app.chat.conversations import Conversations
from app.chat.dialogs import Dialogs
from app.chat.session import ChatSession


class ChatController(QObject):
    def __init__(self, conversations: Conversations, session: ChatSession, *,
                 view: ConversationView, composer: Composer, dialogs: Dialogs,
                 status: QStatusBar, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.conversations = conversations
        self.session = session
        self.view = view
        self.composer = composer
        self.dialogs = dialogs
        self.status = status
        self.closed = False

    @property
    def current(self) -> int | None:
        """The open conversation."""
        return self.conversations.current
