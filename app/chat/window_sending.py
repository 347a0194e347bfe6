"""The chat window's sending actions (a mixin of ``MainWindow``): send, edit and regenerate
(as branches), stop, and what the window shows while replies stream."""
from __future__ import annotations

from PySide6.QtCore import Slot
from PySide6.QtWidgets import QMessageBox


class SendingActions:
    """Needs the window's ``conversations``, ``session``, ``model``, ``view``, ``composer``
    and ``statusBar()``."""

    # -- sending, editing, stopping ----------------------------------------------------------
    def confirm(self, title: str, text: str) -> bool:
        """Ask yes/no (tests replace this)."""
        answer = QMessageBox.question(self, title, text)
        return answer == QMessageBox.StandardButton.Yes

    @Slot(str)
    def on_send(self, text: str) -> None:
        conv = self.current_conv
        if conv is None or not self.session.can_reply():
            return
        editing = self.composer.editing_msg_id
        if editing is not None:
            later = self.conversations.count_after(conv, editing)
            if later and not self.confirm(
                    "Resend edited message?",
                    f"Sending replaces the original message and the {later} message(s) after it."):
                return
            if self.session.edit_and_resend(conv, editing, text) is None:
                return  # not saved: the composer keeps the text (the banner says why)
            self.composer.end_edit()
        elif self.session.send(conv, text) is None:
            return
        self.composer.clear()
        self.view.scroll_to_bottom()

    def begin_edit(self, msg_id: int) -> None:
        msg = self.conversations.editable(msg_id)
        if msg is not None and not self.session.busy:
            self.composer.begin_edit(msg_id, msg.content)

    def regenerate(self, msg_id: int) -> None:
        if self.current_conv is not None and self.session.can_reply():
            self.session.regenerate(self.current_conv, msg_id)

    def stop(self) -> None:
        self.session.stop()
        for msg_id, (content, meta) in self.session.live_messages(self.current_conv).items():
            self.view.update_message(msg_id, content, meta, final=False)

    def on_escape(self) -> None:
        if self.session.busy:
            self.stop()
        elif self.composer.editing_msg_id is not None:
            self.composer.cancel_edit()

    @Slot(int, int)
    def on_stream_updated(self, conv_id: int, msg_id: int) -> None:
        if self._closed or conv_id != self.current_conv:  # (queued signals after shutdown)
            return
        st = self.session.stream_for_message(msg_id)
        if st is not None:
            self.view.update_message(msg_id, st.content, st.live_meta(), final=False)

    @Slot(int, int, str)
    def on_stream_finished(self, conv_id: int, msg_id: int, status: str) -> None:
        if self._closed:  # queued signals can arrive after shutdown
            return
        msg = self.conversations.message(msg_id)
        # A reply the disk had no room for is still in memory: show that, not the stale row.
        content, meta = self.session.live_messages(conv_id).get(
            msg_id, (msg.content, msg.meta) if msg is not None else (None, {}))
        if conv_id == self.current_conv and content is not None:
            self.view.update_message(msg_id, content, meta, final=True)
        if status == "error":
            error = meta.get("error", "")
            self.statusBar().showMessage(f"The reply failed: {error}", 10000)
        self.refresh_sidebar()

    @Slot(int)
    def on_messages_changed(self, conv_id: int) -> None:
        if conv_id == self.current_conv:
            self._reload_view()

    @Slot(bool)
    def on_busy_changed(self, _busy: bool) -> None:
        self._sync_composer()
        self.view.update_actions(busy=self.session.busy)

    def _sync_composer(self) -> None:
        active = self.session.active_stream()
        here = active is not None and active.conv_id == self.current_conv
        hint = ""
        if self.model.loading_path is not None:
            hint = "Loading the model…"
        elif self.model.info is None:
            hint = "No model is loaded."
        elif active is not None and not here:
            title = self.conversations.title(active.conv_id)
            hint = f"A reply is being written in “{title}”. Press Esc to stop it."
        self.composer.set_state(busy=here, can_send=self.model.ready and active is None,
                                hint=hint)

