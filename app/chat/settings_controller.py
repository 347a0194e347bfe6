"""The chat window's per-chat settings: the settings panel and the composer's Think switch show
the open chat's settings; edits, presets and resets are saved through ``Conversations``.

``ChatSettingsController(conversations, store, model, panel=, composer=)`` uses only what it is
given (``store``: the ``ChatStore`` that keeps the presets).
"""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QObject

from app.chat.composer import Composer
from app.chat.conversations import Conversations
from app.chat.settings import ChatSettings
from app.chat.settings_dialog import ChatSettingsPanel
from app.db import ChatStore
from app.loaded_model import LoadedModel


class ChatSettingsController(QObject):
    def __init__(self, conversations: Conversations, store: ChatStore, model: LoadedModel, *,
                 panel: ChatSettingsPanel, composer: Composer,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.conversations = conversations
        self.store = store
        self.model = model
        self.panel = panel
        self.composer = composer

    @property
    def current(self) -> int | None:
        return self.conversations.current

    def show(self, conv_id: int) -> None:
        """The panel and the Think switch show ``conv_id``'s settings (it was opened)."""
        self.panel.form.set_settings(self.conversations.settings_for(conv_id))
        self.panel.set_defaults(self.conversations.defaults)
        self.sync_thinking()

    def on_chat_settings_changed(self, settings: ChatSettings) -> None:
        if self.current is not None:
            self.conversations.set_settings(self.current, settings)
        self.sync_thinking()

    def sync_thinking(self) -> None:
        """The composer's Think switch shows this chat's setting and the model's ability."""
        if self.current is None:
            return
        info = self.model.info
        able = info is None or bool(getattr(info, "supports_thinking", False))
        self.composer.set_thinking(self.conversations.settings_for(self.current).thinking,
                                   available=able)

    def set_thinking(self, on: bool) -> None:
        if self.current is None:
            return
        settings = replace(self.conversations.settings_for(self.current), thinking=on)
        self.conversations.set_settings(self.current, settings)
        self.panel.form.set_settings(settings)

    def load_presets(self) -> None:
        self.panel.set_presets(self.store.presets())

    def save_preset(self, name: str, prompt: str) -> None:
        self.store.save_preset(name, prompt)
        self.load_presets()

    def delete_preset(self, name: str) -> None:
        if name:
            self.store.delete_preset(name)
            self.load_presets()

    def reset_chat_settings(self) -> None:
        if self.current is not None:
            self.panel.form.set_settings(self.conversations.reset_settings(self.current))
            self.panel.set_defaults(self.conversations.defaults)
