"""The chat window's sending actions: send, edit and regenerate (as branches), stop, and what
the window shows while replies stream.

``SendingController(conversations, session, model, chats=, view=, composer=, dialogs=, status=)``
uses only what it is given (``chats``: the ``ConversationController``, to show the open
conversation again and refresh the list; ``app.chat.controller.ChatController`` keeps what the
two share).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QStatusBar

from app.chat.attachments import estimate_tokens, with_attachments
from app.chat.composer import Composer
from app.chat.context import context_budget, plan_fit
from app.chat.controller import ChatController
from app.chat.conversation_controller import ConversationController
from app.chat.conversation_view import ConversationView
from app.chat.conversations import Conversations
from app.chat.dialogs import Dialogs
from app.chat.images import images_of, model_reads_images, no_vision_message
from app.chat.markdown import strip_think
from app.chat.session import ChatSession
from app.loaded_model import LoadedModel


class SendingController(ChatController):
    def __init__(self, conversations: Conversations, session: ChatSession, model: LoadedModel, *,
                 chats: ConversationController, view: ConversationView, composer: Composer,
                 dialogs: Dialogs, status: QStatusBar, parent: QObject | None = None) -> None:
        super().__init__(conversations, session, view=view, composer=composer, dialogs=dialogs,
                         status=status, parent=parent)
        self.model = model
        self.chats = chats

    # -- sending, editing, stopping ----------------------------------------------------------
    @Slot(str)
    def send(self, text: str) -> None:
        """Send (or, while editing, send a new version of the message: the old one stays as
        a branch), after making sure the conversation fits the model's context."""
        conv = self.current
        if conv is None or not self.session.can_reply():
            return
        editing = self.composer.editing_msg_id
        files = list(self.composer.attachments)
        if images_of(files) and not model_reads_images(self.model.info):
            # (attached while a vision model was loaded, and the model changed since)
            self.composer.show_attach_error(no_vision_message(self.model.info.name))
            return
        if not self.make_room(conv, text, files, editing=editing):
            return
        if editing is not None:
            if self.session.edit_and_resend(conv, editing, text) is None:
                return  # not saved: the composer keeps the text (the banner says why)
            self.composer.end_edit()
        elif self.session.send(conv, text, files) is None:
            return
        self.composer.clear()
        self.view.scroll_to_bottom()

    def make_room(self, conv: int, text: str, files: list, *, editing: int | None) -> bool:
        """True when the prompt fits the context (after the user agreed to leave the oldest
        turns out of it, if it had to); otherwise says why and returns False."""
        budget = context_budget(self.model.info, self.conversations.settings_for(conv))
        if budget is None:
            return True
        users = {m.id for m in self.conversations.messages(conv) if m.role == "user"}
        fit = plan_fit(self.prompt_sizes(conv, text, files, editing=editing), budget, users)
        if fit.fits:
            return True
        if fit.cut is None:
            self.dialogs.show_error("Message too long", (
                f"This message{' and its attachments' if files else ''} (about {fit.need:,} "
                f"tokens with the system prompt) does not fit the model's context of "
                f"{budget:,} tokens left for the prompt. Shorten it or attach less."))
            return False
        if not self.dialogs.confirm("The conversation no longer fits", (
                f"This conversation is now about {fit.need:,} tokens; the model's context "
                f"leaves {budget:,} for the prompt. Leave the oldest {fit.dropped} message(s) "
                "out of the prompt? They stay in the chat; the system prompt is kept.")):
            return False
        self.conversations.drop_before(conv, fit.cut)
        return True

    def prompt_sizes(self, conv: int, text: str, files: list, *,
                     editing: int | None) -> list[tuple[int | None, int]]:
        """(message id, estimated tokens) of the prompt that sending would build: the system
        prompt (id None), the branch's messages up to what is being edited, the new one."""
        settings = self.conversations.settings_for(conv)
        attached = self.conversations.attachments(conv)
        if editing is not None:
            files = attached.get(editing, [])
        sizes = [(None, estimate_tokens(settings.system_prompt))]
        start = self.conversations.context_from(conv) or 0
        for m in self.conversations.messages(conv):
            if editing is not None and m.id >= editing:
                break
            if m.id >= start:
                body = strip_think(m.content) if m.role == "assistant" else m.content
                sizes.append((m.id, estimate_tokens(with_attachments(body, attached.get(m.id, ())))))
        sizes.append((None, estimate_tokens(with_attachments(text, files))))
        return sizes

    def begin_edit(self, msg_id: int) -> None:
        msg = self.conversations.editable(msg_id)
        if msg is not None and not self.session.busy:
            self.composer.begin_edit(msg_id, msg.content)

    def regenerate(self, msg_id: int) -> None:
        """A new version of the reply; the old one stays, one click away ("‹ 1/2 ›")."""
        if self.current is not None and self.session.can_reply():
            self.session.regenerate(self.current, msg_id)

    @Slot(int, int)
    def switch_branch(self, msg_id: int, step: int) -> None:
        """Show another version of ``msg_id`` and the conversation that followed it."""
        if self.current is None or self.session.busy:
            return
        if self.conversations.switch_branch(self.current, msg_id, step) is not None:
            self.chats.reload_view()

    def stop(self) -> None:
        self.session.stop()
        for msg_id, (content, meta) in self.session.live_messages(self.current).items():
            self.view.update_message(msg_id, content, meta, final=False)

    def on_escape(self) -> None:
        if self.session.busy:
            self.stop()
        elif self.composer.editing_msg_id is not None:
            self.composer.cancel_edit()

    # -- what streams ---------------------------------------------------------------------------
    @Slot(int, int)
    def on_stream_updated(self, conv_id: int, msg_id: int) -> None:
        if self.closed or conv_id != self.current:  # (queued signals after shutdown)
            return
        st = self.session.stream_for_message(msg_id)
        if st is not None:
            self.view.update_message(msg_id, st.content, st.live_meta(), final=False)

    @Slot(int, int, str)
    def on_stream_finished(self, conv_id: int, msg_id: int, status: str) -> None:
        if self.closed:  # queued signals can arrive after shutdown
            return
        msg = self.conversations.message(msg_id)
        # A reply the disk had no room for is still in memory: show that, not the stale row.
        content, meta = self.session.live_messages(conv_id).get(
            msg_id, (msg.content, msg.meta) if msg is not None else (None, {}))
        if conv_id == self.current and content is not None:
            self.view.update_message(msg_id, content, meta, final=True)
        if status == "error":
            error = meta.get("error", "")
            self.status.showMessage(f"The reply failed: {error}", 10000)
        self.chats.refresh_sidebar()

    @Slot(int)
    def on_messages_changed(self, conv_id: int) -> None:
        if conv_id == self.current:
            self.chats.reload_view()

    @Slot(bool)
    def on_busy_changed(self, _busy: bool) -> None:
        self.sync_composer()
        self.view.update_actions(busy=self.session.busy)

    def sync_composer(self) -> None:
        """The composer's button and hint follow the model and the streaming reply."""
        active = self.session.active_stream()
        held = self.current in self.session.tool_holds  # waiting on a tool call
        here = held or (active is not None and active.conv_id == self.current)
        hint = ""
        if self.model.loading_path is not None:
            hint = "Loading the model…"
        elif self.model.info is None:
            hint = "No model is loaded."
        elif active is not None and not here:
            title = self.conversations.title(active.conv_id)
            hint = f"A reply is being written in “{title}”. Press Esc to stop it."
        elif self.session.tool_holds and not held:
            title = self.conversations.title(next(iter(self.session.tool_holds)))
            hint = f"A reply in “{title}” waits for your answer to a tool call. Esc stops it."
        self.composer.set_state(busy=here, can_send=self.model.ready and not self.session.busy,
                                hint=hint)
        info = self.model.info
        self.composer.set_vision(model_reads_images(info), info.name if info is not None else None)

    @Slot()
    def on_attachments_changed(self) -> None:
        """Warn, before sending, when the attached files would overflow the context."""
        conv = self.current
        files = self.composer.attachments
        budget = (context_budget(self.model.info, self.conversations.settings_for(conv))
                  if conv is not None else None)
        if not files or budget is None:
            self.composer.set_warning("")
            return
        sizes = self.prompt_sizes(conv, self.composer.text, files, editing=None)
        need = sum(n for _, n in sizes)
        attached = sum(estimate_tokens(a.content) for a in files)
        if need > budget:
            self.composer.set_warning(
                f"⚠ The attachments (about {attached:,} tokens) would overflow the model's "
                f"context ({budget:,} tokens for the prompt): sending will offer to leave the "
                "oldest turns out, or remove a file.")
        elif need > 0.75 * budget:
            self.composer.set_warning(f"The prompt will use about {need:,} of {budget:,} tokens.")
        else:
            self.composer.set_warning("")
