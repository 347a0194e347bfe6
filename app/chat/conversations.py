"""The conversations controller: every conversation operation of the chat window, as plain
logic over the ``ChatStore`` (no Qt). The window asks it and shows the answers.

Contract
--------
- ``current`` is the conversation on screen (None only between a deletion and the next open).
- ``start()`` prepares the store for a session (deleted conversations purged, replies left
  streaming by a crash marked interrupted, empty "New chat" leftovers erased) and returns the
  conversation to open: the most recent one, or a new one.
- Deleting is soft and undoable until the next deletion (which makes the earlier one final)
  or the end of the session (``close()`` purges).
- Chat settings: ``defaults`` (app-wide, for new chats) and each conversation's own, read with
  ``settings_for`` (missing keys fall back to the defaults).
"""
from __future__ import annotations

import logging
import re
import sqlite3
from pathlib import Path

from app.chat.export import file_name, to_json, to_markdown
from app.chat.markdown import plain_inline
from app.chat.settings import ChatSettings
from app.db import LEAF, Attachment, ChatStore, Conversation, Message

NEW_TITLE = "New chat"
log = logging.getLogger(__name__)


def make_title(text: str, limit: int = 48) -> str:
    """A conversation title from its first message: one line, at most ``limit`` characters."""
    line = " ".join(plain_inline(text).strip().split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


_MARKUP = re.compile(r"``|`|\*\*|\*|::|(?<!\w)\.\.(?!\.)|^#+\s*", re.M)


def snippet(text: str, term: str, width: int = 70) -> str:
    """One line of ``text`` around the first (case-insensitive) occurrence of ``term``: the
    Markdown/RST markup (backticks, asterisks, ``::``, ``..``, headings) taken out, clipped at
    word boundaries, with "…" on each clipped side."""
    flat = " ".join(_MARKUP.sub("", text).split())
    i = flat.lower().find(term.strip().lower())
    start = 0 if i < 0 else max(0, i - width // 3)
    end = min(len(flat), start + width)
    if start and " " in flat[start:i]:  # begin at a word
        start = flat.index(" ", start) + 1
    if end < len(flat) and " " in flat[max(i, start) + 1:end]:  # end after a word
        end = flat.rindex(" ", max(i, start) + 1, end)
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")


class Conversations:
    def __init__(self, store: ChatStore) -> None:
        self.store = store
        self.current: int | None = None
        self.last_deleted: int | None = None
        self.defaults = ChatSettings.from_dict(store.get_setting("defaults"))

    # -- session -----------------------------------------------------------------------------
    def start(self) -> int:
        self.store.purge_deleted()
        self.store.mark_interrupted()
        for c in self.store.conversations():
            if c.title == NEW_TITLE and not self.store.path_ids(c.id):
                self.store.erase_conversation(c.id)  # empty leftovers of earlier sessions
        convs = self.store.conversations()
        return convs[0].id if convs else self.create()

    def close(self) -> None:
        try:
            self.store.purge_deleted()
        except (sqlite3.Error, OSError) as exc:  # a full disk: purged at the next start
            log.warning("could not remove deleted chats on closing: %s", exc)
        self.store.close()

    # -- queries -----------------------------------------------------------------------------
    def listing(self, search: str = "") -> list[Conversation]:
        return self.store.conversations(search=search)

    def search_matches(self, search: str) -> dict[int, tuple[int, str]]:
        """conversation id -> (first matching message id, a one-line snippet around it)."""
        if not search.strip():
            return {}
        return {c: (m, snippet(text, search))
                for c, (m, text) in self.store.first_matches(search).items()}

    def get(self, conv_id: int | None) -> Conversation | None:
        return self.store.conversation(conv_id) if conv_id is not None else None

    def title(self, conv_id: int, fallback: str = "another chat") -> str:
        conv = self.get(conv_id)
        return conv.title if conv else fallback

    def messages(self, conv_id: int | None = None, *, preview: int | None = None) -> list[Message]:
        """``preview``: only the first ``preview`` characters of each message (for the view;
        a 50 MB paste is not read whole to show its beginning)."""
        conv_id = self.current if conv_id is None else conv_id
        return self.store.messages(conv_id, preview=preview) if conv_id is not None else []

    def message(self, msg_id: int) -> Message | None:
        return self.store.message(msg_id)

    def is_empty(self, conv_id: int | None) -> bool:
        return conv_id is not None and not self.store.path_ids(conv_id)

    def count_after(self, conv_id: int, msg_id: int) -> int:
        """Messages after ``msg_id`` on the branch on screen."""
        return sum(1 for i in self.store.path_ids(conv_id) if i > msg_id)

    def branches(self, conv_id: int) -> dict[int, tuple[int, int]]:
        """msg_id -> (index, count) for every message with other versions (1-based index)."""
        groups: dict[int | None, list[int]] = {}
        for mid, parent in self.store.parents(conv_id).items():
            groups.setdefault(parent, []).append(mid)
        return {mid: (i + 1, len(ids)) for ids in groups.values() if len(ids) > 1
                for i, mid in enumerate(ids)}

    def switch_branch(self, conv_id: int, msg_id: int, step: int) -> int | None:
        """Show the version ``step`` away from ``msg_id`` (and the branch below it); returns
        the version now shown, None when there is none that way."""
        b = self.store.branch(msg_id)
        if b is None or not 0 <= b.index + step < b.count:
            return None
        target = b.siblings[b.index + step]
        self.store.select_branch(conv_id, target)
        return target

    def attachments(self, conv_id: int) -> dict[int, list[Attachment]]:
        return self.store.attachments(self.store.path_ids(conv_id))

    def context_from(self, conv_id: int) -> int | None:
        return self.store.context_from(conv_id)

    def drop_before(self, conv_id: int, msg_id: int | None) -> None:
        """Leave the messages older than ``msg_id`` out of the prompt (they stay on screen)."""
        self.store.set_context_from(conv_id, msg_id)

    def editable(self, msg_id: int) -> Message | None:
        msg = self.store.message(msg_id)
        return msg if msg is not None and msg.role == "user" else None

    # -- operations --------------------------------------------------------------------------
    def create(self) -> int:
        return self.store.create_conversation(settings=self.defaults.to_dict())

    def rename(self, conv_id: int, title: str) -> None:
        self.store.rename_conversation(conv_id, title)

    def title_from(self, conv_id: int, text: str) -> None:
        """Name a "New chat" after its first message."""
        conv = self.get(conv_id)
        if conv is not None and conv.title == NEW_TITLE:
            self.store.rename_conversation(conv_id, make_title(text))

    def retitle_after_edit(self, conv_id: int, old: Message, text: str) -> None:
        """The first message (no parent) was edited: a title made from its old text, not
        one the user chose, follows the new text."""
        conv = self.get(conv_id)
        if old.parent_id is None and conv is not None and conv.title == make_title(old.content):
            self.store.rename_conversation(conv_id, make_title(text))

    def delete(self, conv_id: int) -> Conversation | None:
        """Soft-delete (undoable); an earlier undoable deletion becomes final. If it was the
        current conversation, ``current`` becomes None: open ``next_after_delete()``."""
        conv = self.get(conv_id)
        if conv is None:
            return None
        self.store.purge_deleted()
        self.store.delete_conversation(conv_id)
        self.last_deleted = conv_id
        if conv_id == self.current:
            self.current = None
        return conv

    def next_after_delete(self) -> int:
        rest = self.store.conversations()
        return rest[0].id if rest else self.create()

    def undo_delete(self) -> int | None:
        """Bring the last deleted conversation back; returns its id (None if nothing to undo)."""
        cid, self.last_deleted = self.last_deleted, None
        if cid is not None:
            self.store.undelete_conversation(cid)
        return cid

    def touch(self, conv_id: int) -> None:
        self.store.touch(conv_id)

    # -- messages (written by the chat session) -----------------------------------------------
    def add_user_message(self, conv_id: int, text: str, *, attachments=(),
                         parent_id=LEAF) -> int:
        """Append to the branch on screen, or (``parent_id``) start a new version there."""
        return self.store.add_message(conv_id, "user", text, attachments=tuple(attachments),
                                      parent_id=parent_id)

    def new_version_of(self, conv_id: int, msg_id: int) -> Message | None:
        """Prepare a new version of ``msg_id``: the branch on screen ends at its parent (the
        old version is kept). Returns the message (None if gone)."""
        msg = self.store.message(msg_id)
        if msg is not None and msg.parent_id is not None:
            self.store.set_leaf(conv_id, msg.parent_id)
        return msg

    def add_reply(self, conv_id: int, meta: dict) -> int:
        """An empty assistant message that a reply streams into."""
        return self.store.add_message(conv_id, "assistant", "", meta=meta)

    def save_reply(self, msg_id: int, content: str, meta: dict) -> None:
        self.store.update_message(msg_id, content=content, meta=meta)

    def truncate(self, conv_id: int, msg_id: int) -> None:
        """Delete message ``msg_id`` and every later one."""
        self.store.delete_messages_from(conv_id, msg_id)

    # -- export ------------------------------------------------------------------------------
    def export_text(self, conv_id: int, fmt: str) -> str:
        conv = self.get(conv_id)
        msgs = self.store.messages(conv_id)
        files = self.store.attachments([m.id for m in msgs])
        return to_markdown(conv, msgs, files) if fmt == "md" else to_json(conv, msgs, files)

    def export(self, conv_id: int, fmt: str, path: str | Path) -> Path:
        out = Path(path)
        out.write_text(self.export_text(conv_id, fmt), encoding="utf-8")
        return out

    def export_name(self, conv_id: int, fmt: str) -> str:
        return file_name(self.title(conv_id, "chat"), fmt)

    # -- settings ----------------------------------------------------------------------------
    def settings_for(self, conv_id: int) -> ChatSettings:
        conv = self.get(conv_id)
        settings, bad = ChatSettings.parse(conv.settings if conv else None, base=self.defaults)
        if bad:
            self.store.note_problem(conv_id, f"its {', '.join(bad)} setting")
        return settings

    def set_settings(self, conv_id: int, settings: ChatSettings) -> None:
        """Saves ``settings``; the chat's tool choice (``"tools"``, ``app.tools``) is kept."""
        conv = self.get(conv_id)
        kept = {k: v for k, v in (conv.settings if conv else {}).items() if k == "tools"}
        self.store.set_conversation_settings(conv_id, {**settings.to_dict(), **kept})

    def reset_settings(self, conv_id: int) -> ChatSettings:
        self.set_settings(conv_id, self.defaults)
        return self.defaults

    def set_defaults(self, defaults: ChatSettings) -> None:
        self.defaults = defaults
        self.store.set_setting("defaults", defaults.to_dict())

    def preferences(self) -> dict | None:
        return self.store.get_setting("preferences")

    def set_preferences(self, prefs: dict) -> None:
        self.store.set_setting("preferences", prefs)

    def last_model(self) -> str | None:
        last = self.store.get_setting("last_model")
        return last if isinstance(last, str) else None

    def remember_model(self, path: str) -> None:
        self.store.set_setting("last_model", path)
