"""Chat persistence: one SQLite file (WAL) with a versioned schema.

Contract: the schema version lives in ``PRAGMA user_version``; ``MIGRATIONS[i]`` upgrades
version ``i`` to ``i + 1`` inside one transaction, so a file written by an older release is
upgraded in place and never rewritten wholesale. Conversations are soft-deleted first
(``deleted_at``) so the UI can undo; ``purge_deleted`` removes them for good.
Ids are AUTOINCREMENT: never reused, so a late write for a deleted reply cannot land in
a newer one. Messages carry ``meta`` (JSON: status, stats, think seconds, draft spans...). Used from the UI
thread only.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 4
log = logging.getLogger(__name__)


def _run_script(db: sqlite3.Connection, script: str) -> None:
    # Not executescript(): it would COMMIT the migration's transaction halfway.
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _v0_to_v1(db: sqlite3.Connection) -> None:
    _run_script(db, """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL DEFAULT 'New chat',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            settings TEXT NOT NULL DEFAULT '{}',
            deleted_at REAL
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            meta TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
        CREATE INDEX conversations_by_use ON conversations(updated_at);
        CREATE TABLE app_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """)


def _v1_to_v2(db: sqlite3.Connection) -> None:
    """Branches (each message's ``parent_id``, each conversation's ``leaf_id``: the version on
    screen), attachments, system-prompt presets and ``context_from`` (older turns left out of
    the prompt). Existing chats become one straight branch; nothing is rewritten."""
    _run_script(db, """
        ALTER TABLE messages ADD COLUMN parent_id INTEGER
            REFERENCES messages(id) ON DELETE CASCADE;
        ALTER TABLE conversations ADD COLUMN leaf_id INTEGER;
        ALTER TABLE conversations ADD COLUMN context_from INTEGER;
        UPDATE messages SET parent_id = (SELECT max(p.id) FROM messages p
            WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id);
        UPDATE conversations SET leaf_id = (SELECT max(m.id) FROM messages m
            WHERE m.conversation_id = conversations.id);
        CREATE INDEX messages_by_parent ON messages(conversation_id, parent_id);
        CREATE TABLE attachments (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            kind TEXT NOT NULL DEFAULT 'text',
            content TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL
        );
        CREATE INDEX attachments_by_message ON attachments(message_id, id);
        CREATE TABLE presets (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL UNIQUE,
            system_prompt TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL
        );
    """)


def _v2_to_v3(db: sqlite3.Connection) -> None:
    """``tool`` messages (a tool's result in a chat with tools, ``app.tools``). SQLite cannot
    change a CHECK constraint in place: the table is rebuilt as its documented procedure says
    (foreign keys are off during migrations, checked before the commit), every row, id,
    parent and the id sequence kept, so attachments and branches stay where they were."""
    seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
    _run_script(db, """
        CREATE TABLE messages_v3 (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
            content TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            meta TEXT NOT NULL DEFAULT '{}',
            parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE
        );
        INSERT INTO messages_v3 (id, conversation_id, role, content, created_at, meta, parent_id)
            SELECT id, conversation_id, role, content, created_at, meta, parent_id FROM messages;
        DROP TABLE messages;
        ALTER TABLE messages_v3 RENAME TO messages;
        CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
        CREATE INDEX messages_by_parent ON messages(conversation_id, parent_id)
    """)
    if seq is not None:
        db.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'messages'",
                   (seq[0],))


def _v3_to_v4(db: sqlite3.Connection) -> None:
    """Images sent with a message (issue 32): an attachment's file bytes in ``data`` (kind
    "image"; text attachments keep their text in ``content`` and an empty ``data``)."""
    db.execute("ALTER TABLE attachments ADD COLUMN data BLOB NOT NULL DEFAULT x''")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v0_to_v1, _v1_to_v2, _v2_to_v3,
                                                          _v3_to_v4]
LEAF = object()  # add_message's default parent: the conversation's current leaf


class SchemaTooNewError(RuntimeError):
    """The file was written by a newer MTP Chat; we refuse to touch it."""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    created_at: float
    meta: dict = field(default_factory=dict)
    parent_id: int | None = None
    full_length: int | None = None  # read as a preview: the whole content's length (characters)


@dataclass(frozen=True)
class Attachment:
    """A file sent with a message. ``kind`` "text", "code", "markdown" or "pdf": its text is
    ``content``; ``kind`` "image": the image file's bytes are ``data`` (``content`` empty)."""

    name: str
    content: str
    kind: str = "text"
    data: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class Branch:
    """Where a message sits among its versions: ``index`` (0-based) of ``count``."""

    index: int
    count: int
    siblings: tuple[int, ...]


class ChatStore:
    """CRUD over conversations and messages. Every write commits immediately.

    ``ChatStore(path)`` raises on a file it cannot use; ``open_chat_store`` is the forgiving
    entry point the app uses. A store made with ``ChatStore.in_memory(copy_of=...)`` keeps
    working (reads and writes) but saves nothing: ``persistent`` is False.

    A bad value in a sound file (JSON nested too deep, a meta field of the wrong type, a
    timestamp that is not a number) is read as if absent (left as it is on disk), logged
    with the file and the chat, and reported once per chat and field to ``on_problem(conv_id,
    text)`` (the window shows it; ``problems`` keeps what was found before one was set).
    """

    def __init__(self, path: str | Path, *, connection: sqlite3.Connection | None = None) -> None:
        self.path = Path(path)
        self.persistent = connection is None
        if connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(str(self.path), isolation_level=None)
        self._db = connection
        self._db.row_factory = sqlite3.Row
        self.problems: list[tuple[int | None, str]] = []
        self.on_problem: Callable[[int | None, str], None] | None = None
        self._seen_problems: set[tuple[int | None, str]] = set()
        self._refuse_newer()  # before anything writes (WAL mode rewrites the header)
        if self.persistent:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    @classmethod
    def in_memory(cls, path: str | Path, *, copy_of: sqlite3.Connection | None = None) -> "ChatStore":
        """A store in memory (nothing is saved), optionally starting as a copy of ``copy_of``."""
        mem = sqlite3.connect(":memory:", isolation_level=None)
        if copy_of is not None:
            copy_of.backup(mem)
        return cls(path, connection=mem)

    def integrity_ok(self) -> bool:
        return self._db.execute("PRAGMA quick_check").fetchone()[0] == "ok"

    def close(self) -> None:
        self._db.close()

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _refuse_newer(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            self._db.close()
            raise SchemaTooNewError(
                f"{self.path} uses schema {version}; this MTP Chat understands up to "
                f"{SCHEMA_VERSION}. Update the app (your chats were left untouched).")

    def _migrate(self) -> None:
        version = self.schema_version
        if version >= SCHEMA_VERSION:
            return
        # Off while tables are rebuilt (a DROP would cascade); checked before each commit.
        self._db.execute("PRAGMA foreign_keys=OFF")
        try:
            for v in range(version, SCHEMA_VERSION):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    MIGRATIONS[v](self._db)
                    if self._db.execute("PRAGMA foreign_key_check").fetchone() is not None:
                        raise sqlite3.IntegrityError("a migration broke a foreign key")
                    self._db.execute(f"PRAGMA user_version = {v + 1}")
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        finally:
            self._db.execute("PRAGMA foreign_keys=ON")

    def note_problem(self, conv_id: int | None, what: str) -> None:
        """A bad value of chat ``conv_id`` (None: an app setting) was ignored: log it with the
        file and the chat, and tell ``on_problem`` (once per chat and field)."""
        if (conv_id, what) in self._seen_problems:
            return
        self._seen_problems.add((conv_id, what))
        if conv_id is None:
            log.warning("chat database %s: ignored a bad value: %s", self.path, what)
            text = f"A damaged app setting was ignored ({what})."
        else:
            title = self._title_of(conv_id)
            log.warning("chat database %s: chat %d %r: ignored a bad value: %s",
                        self.path, conv_id, title, what)
            text = f"Chat \u201c{title}\u201d had a damaged value ({what}); it was ignored."
        self.problems.append((conv_id, text))
        if self.on_problem is not None:
            self.on_problem(conv_id, text)

    def _title_of(self, conv_id: int) -> str:
        row = self._db.execute("SELECT title FROM conversations WHERE id=?", (conv_id,)).fetchone()
        return (_text(row["title"]) if row is not None else "") or f"#{conv_id}"

    def _conv(self, row: sqlite3.Row) -> Conversation:
        cid = row["id"]
        created = self._timestamp(row["created_at"], cid, "its creation time")
        updated = self._timestamp(row["updated_at"], cid, "its last-used time", created)
        return Conversation(id=cid, title=_text(row["title"]) or "Untitled",
                            created_at=created, updated_at=updated,
                            settings=self._json_dict(row["settings"], cid, "its settings"))

    def _msg(self, row: sqlite3.Row) -> Message:
        cid, mid = row["conversation_id"], row["id"]
        meta = self._json_dict(row["meta"], cid, f"message {mid}'s details")
        bad = [k for k, v in meta.items() if k in _META_TYPES and not _META_TYPES[k](v)]
        if bad:
            self.note_problem(cid, f"message {mid}'s {', '.join(bad)}")
            meta = {k: v for k, v in meta.items() if k not in bad}
        parent = row["parent_id"]
        content = _text(row["content"])
        # (a Row's `in` looks at its values, not its column names)
        full = row["full_length"] if "full_length" in row.keys() else None  # noqa: SIM118
        return Message(id=mid, conversation_id=cid, role=row["role"], content=content,
                       created_at=self._timestamp(row["created_at"], cid, f"message {mid}'s time"),
                       meta=meta, parent_id=parent if isinstance(parent, int) else None,
                       full_length=full if isinstance(full, int) and full > len(content) else None)

    def _json_dict(self, text, conv_id: int | None, what: str) -> dict:
        value = _json_dict(text)
        if value is None:
            self.note_problem(conv_id, what)
            return {}
        return value

    def _timestamp(self, value, conv_id: int, what: str, fallback: float = 0.0) -> float:
        if _finite(value):
            return float(value)
        self.note_problem(conv_id, what)
        return fallback

    # -- conversations ---------------------------------------------------------------------
    def create_conversation(self, *, title: str = "New chat", settings: dict | None = None) -> int:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations (title, created_at, updated_at, settings) VALUES (?,?,?,?)",
            (title, now, now, json.dumps(settings or {})))
        return int(cur.lastrowid)

    def conversation(self, conv_id: int) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id=? AND deleted_at IS NULL",
                               (conv_id,)).fetchone()
        return self._conv(row) if row else None

    def conversations(self, *, search: str = "") -> list[Conversation]:
        """Live conversations, most recently used first; ``search`` matches titles and text."""
        if not search.strip():
            rows = self._db.execute(
                "SELECT * FROM conversations WHERE deleted_at IS NULL "
                "ORDER BY updated_at DESC, id DESC").fetchall()
            return [self._conv(r) for r in rows]
        pattern = "%" + _escape_like(search.strip()) + "%"
        rows = self._db.execute(
            "SELECT * FROM conversations c WHERE c.deleted_at IS NULL AND ("
            " c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
            " WHERE m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\'))"
            " ORDER BY c.updated_at DESC, c.id DESC", (pattern, pattern)).fetchall()
        return [self._conv(r) for r in rows]

    def first_matches(self, search: str) -> dict[int, tuple[int, str]]:
        """For each live conversation with a message containing ``search``: (the first such
        message's id, its text)."""
        pattern = "%" + _escape_like(search.strip()) + "%"
        rows = self._db.execute(
            "SELECT m.conversation_id AS c, m.id AS id, m.content AS content FROM messages m "
            "JOIN conversations c ON c.id = m.conversation_id WHERE c.deleted_at IS NULL AND "
            "m.content LIKE ? ESCAPE '\\' ORDER BY m.id", (pattern,)).fetchall()
        out: dict[int, tuple[int, str]] = {}
        for r in rows:
            out.setdefault(r["c"], (r["id"], _text(r["content"])))
        return out

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conv_id))

    def set_conversation_settings(self, conv_id: int, settings: dict) -> None:
        self._db.execute("UPDATE conversations SET settings=? WHERE id=?",
                         (json.dumps(settings), conv_id))

    def touch(self, conv_id: int) -> None:
        self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (time.time(), conv_id))

    def delete_conversation(self, conv_id: int) -> None:
        """Soft delete: hidden everywhere until ``undelete_conversation`` or ``purge_deleted``."""
        self._db.execute("UPDATE conversations SET deleted_at=? WHERE id=?", (time.time(), conv_id))

    def undelete_conversation(self, conv_id: int) -> None:
        self._db.execute("UPDATE conversations SET deleted_at=NULL WHERE id=?", (conv_id,))

    def purge_deleted(self) -> int:
        cur = self._db.execute("DELETE FROM conversations WHERE deleted_at IS NOT NULL")
        return cur.rowcount

    def erase_conversation(self, conv_id: int) -> None:
        """Permanent delete (the self-test cleans up after itself with this)."""
        self._db.execute("DELETE FROM conversations WHERE id=?", (conv_id,))

    # -- messages --------------------------------------------------------------------------
    def add_message(self, conv_id: int, role: str, content: str, *,
                    meta: dict | None = None, parent_id=LEAF,
                    attachments: tuple[Attachment, ...] | list[Attachment] = ()) -> int:
        """Append a message under ``parent_id`` (default: the message on screen last, the
        leaf; None: a new first message) and make it the leaf. One transaction."""
        now = time.time()
        if parent_id is LEAF:
            path = self.messages(conv_id)
            parent_id = path[-1].id if path else None
        self._db.execute("BEGIN IMMEDIATE")
        try:
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, created_at, meta, parent_id) "
                "VALUES (?,?,?,?,?,?)",
                (conv_id, role, content, now, json.dumps(meta or {}), parent_id))
            msg_id = int(cur.lastrowid)
            self._db.executemany(
                "INSERT INTO attachments (message_id, name, kind, content, data, created_at) "
                "VALUES (?,?,?,?,?,?)",
                [(msg_id, a.name, a.kind, a.content, bytes(a.data), now) for a in attachments])
            self._db.execute("UPDATE conversations SET updated_at=?, leaf_id=? WHERE id=?",
                             (now, msg_id, conv_id))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return msg_id

    def update_message(self, msg_id: int, *, content: str | None = None,
                       meta: dict | None = None) -> None:
        if content is not None:
            self._db.execute("UPDATE messages SET content=? WHERE id=?", (content, msg_id))
        if meta is not None:
            self._db.execute("UPDATE messages SET meta=? WHERE id=?", (json.dumps(meta), msg_id))

    def message(self, msg_id: int) -> Message | None:
        row = self._db.execute("SELECT * FROM messages WHERE id=?", (msg_id,)).fetchone()
        return self._msg(row) if row else None

    def all_messages(self, conv_id: int) -> list[Message]:
        """Every message of every branch, oldest first."""
        rows = self._db.execute("SELECT * FROM messages WHERE conversation_id=? ORDER BY id",
                                (conv_id,)).fetchall()
        return [self._msg(r) for r in rows]

    def parents(self, conv_id: int) -> dict[int, int | None]:
        """Every message id of the conversation (all branches, oldest first) -> its parent's
        id. Read from an index: no message text is touched."""
        # (no ORDER BY: SQLite would read the rows, past their text, instead of the index)
        rows = self._db.execute("SELECT id, parent_id FROM messages WHERE conversation_id=?",
                                (conv_id,)).fetchall()
        return {r["id"]: r["parent_id"] if isinstance(r["parent_id"], int) else None
                for r in sorted(rows, key=lambda r: r["id"])}

    def path_ids(self, conv_id: int) -> list[int]:
        """The ids of the branch on screen, first message to leaf (see ``messages``)."""
        parents = self.parents(conv_id)
        if not parents:
            return []
        row = self._db.execute("SELECT leaf_id FROM conversations WHERE id=?",
                               (conv_id,)).fetchone()
        node = row["leaf_id"] if row is not None else None
        if node not in parents:  # never set, or deleted: the newest message's branch
            node = max(parents)
        path: list[int] = []
        while node in parents and len(path) <= len(parents):
            path.append(node)
            node = parents[node]
        return path[::-1]

    def messages(self, conv_id: int, *, preview: int | None = None) -> list[Message]:
        """The conversation as on screen: the path from the first message to the leaf.
        ``preview``: read only the first ``preview`` characters of each message (a cut one
        has ``full_length``): showing a 50 MB paste does not read it whole."""
        ids = self.path_ids(conv_id)
        cols = "*" if preview is None else (
            "id, conversation_id, role, created_at, meta, parent_id, "
            "substr(content, 1, :n) AS content, length(content) AS full_length")
        found: dict[int, Message] = {}
        for i in range(0, len(ids), 500):  # (SQLite bounds the number of parameters)
            chunk = ids[i:i + 500]
            marks = ",".join(f":i{k}" for k in range(len(chunk)))
            params = {f"i{k}": v for k, v in enumerate(chunk)} | {"n": max(0, preview or 0)}
            rows = self._db.execute(f"SELECT {cols} FROM messages WHERE id IN ({marks})",
                                    params).fetchall()
            found.update((r["id"], self._msg(r)) for r in rows)
        return [found[i] for i in ids if i in found]

    def branch(self, msg_id: int) -> Branch | None:
        """``msg_id`` among the versions that share its parent (oldest first)."""
        msg = self.message(msg_id)
        if msg is None:
            return None
        rows = self._db.execute(
            "SELECT id FROM messages WHERE conversation_id=? AND parent_id IS ? ORDER BY id",
            (msg.conversation_id, msg.parent_id)).fetchall()
        ids = tuple(r["id"] for r in rows)
        return Branch(ids.index(msg_id), len(ids), ids)

    def select_branch(self, conv_id: int, msg_id: int) -> None:
        """Show the branch through ``msg_id``: the leaf becomes its newest descendant."""
        node = msg_id
        while True:
            row = self._db.execute("SELECT max(id) AS id FROM messages WHERE parent_id=?",
                                   (node,)).fetchone()
            if row is None or row["id"] is None:
                break
            node = row["id"]
        self.set_leaf(conv_id, node)

    def set_leaf(self, conv_id: int, msg_id: int | None) -> None:
        self._db.execute("UPDATE conversations SET leaf_id=? WHERE id=?", (msg_id, conv_id))

    def attachments(self, msg_ids: list[int]) -> dict[int, list[Attachment]]:
        """The attachments of each of ``msg_ids`` that has some, in the order added."""
        if not msg_ids:
            return {}
        marks = ",".join("?" * len(msg_ids))
        rows = self._db.execute(
            f"SELECT message_id, name, kind, content, data FROM attachments "
            f"WHERE message_id IN ({marks}) ORDER BY id", list(msg_ids)).fetchall()
        out: dict[int, list[Attachment]] = {}
        for r in rows:
            data = r["data"] if isinstance(r["data"], bytes) else b""
            out.setdefault(r["message_id"], []).append(
                Attachment(_text(r["name"]), _text(r["content"]), _text(r["kind"]) or "text",
                           data))
        return out

    def context_from(self, conv_id: int) -> int | None:
        row = self._db.execute("SELECT context_from FROM conversations WHERE id=?",
                               (conv_id,)).fetchone()
        value = row["context_from"] if row is not None else None
        return value if isinstance(value, int) else None

    def set_context_from(self, conv_id: int, msg_id: int | None) -> None:
        """Messages older than ``msg_id`` are left out of the prompt (None: none are)."""
        self._db.execute("UPDATE conversations SET context_from=? WHERE id=?", (msg_id, conv_id))

    # -- system prompt presets -------------------------------------------------------------
    def presets(self) -> list[tuple[str, str]]:
        rows = self._db.execute("SELECT name, system_prompt FROM presets ORDER BY name COLLATE NOCASE")
        return [(_text(r["name"]), _text(r["system_prompt"])) for r in rows.fetchall()]

    def save_preset(self, name: str, system_prompt: str) -> None:
        self._db.execute("INSERT INTO presets (name, system_prompt, created_at) VALUES (?,?,?) "
                         "ON CONFLICT(name) DO UPDATE SET system_prompt=excluded.system_prompt",
                         (name, system_prompt, time.time()))

    def delete_preset(self, name: str) -> None:
        self._db.execute("DELETE FROM presets WHERE name=?", (name,))

    def delete_messages_from(self, conv_id: int, msg_id: int) -> int:
        """Delete ``msg_id`` and every later message of the conversation; returns the count."""
        n = self._db.execute("SELECT count(*) FROM messages WHERE conversation_id=? AND id>=?",
                             (conv_id, msg_id)).fetchone()[0]
        self._db.execute("DELETE FROM messages WHERE conversation_id=? AND id>=?", (conv_id, msg_id))
        return int(n)

    def mark_interrupted(self) -> int:
        """Replies left 'streaming' by a crash become 'interrupted' (their text is kept)."""
        rows = self._db.execute("SELECT id, meta FROM messages WHERE meta LIKE '%streaming%'")
        n = 0
        for row in rows.fetchall():
            meta = _json_dict(row["meta"]) or {}
            if meta.get("status") == "streaming":
                meta["status"] = "interrupted"
                self.update_message(row["id"], meta=meta)
                n += 1
        return n

    # -- app settings ----------------------------------------------------------------------
    def get_setting(self, key: str, default=None):
        row = self._db.execute("SELECT value FROM app_settings WHERE key=?", (key,)).fetchone()
        if row is None:
            return default
        try:
            return json.loads(row["value"])
        except (TypeError, ValueError, RecursionError):
            self.note_problem(None, f"the app setting {key!r}")
            return default

    def set_setting(self, key: str, value) -> None:
        self._db.execute("INSERT INTO app_settings (key, value) VALUES (?, ?) "
                         "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                         (key, json.dumps(value)))


def _escape_like(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _json_dict(text) -> dict | None:
    """A stored JSON object, or None when the value is not one (the row stays as is)."""
    try:
        value = json.loads(text or "{}")
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deeply
        return None
    return value if isinstance(value, dict) else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _spans_ok(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) for x in s) for s in value)


# What the app reads from a message's meta, and the type each must have to be used.
_META_TYPES: dict[str, Callable[[object], bool]] = {
    "status": lambda v: isinstance(v, str),
    "model": lambda v: v is None or isinstance(v, str),
    "error": lambda v: isinstance(v, str),
    "finish_reason": lambda v: isinstance(v, str),
    "stats": lambda v: isinstance(v, dict),
    "draft_spans": _spans_ok,
    "think_s": _finite,
    "tokens": lambda v: isinstance(v, int),
    "request_id": lambda v: isinstance(v, int),
}


def _text(value) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


# -- opening the store whatever state the file is in ------------------------------------------
@dataclass(frozen=True)
class StoreNotice:
    """Why the store is not the plain file it should be: ``kind`` is "recovered" (a corrupt
    file was moved aside to ``backup`` and a fresh one made), "read_only" (the chats are
    shown but nothing new is saved) or "unsaved" (no chats could be read: a fresh store in
    memory). ``message`` is for the user."""

    kind: str
    message: str
    backup: Path | None = None


_CORRUPT = ("not a database", "malformed", "corrupt", "disk image", "unsupported file format")


def _is_corruption(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.DatabaseError) and any(
        s in str(exc).lower() for s in _CORRUPT)


def _move_aside(path: Path) -> Path:
    """Rename a corrupt database (and its WAL/SHM files) to a timestamped backup; never delete."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            shutil.move(str(src), f"{backup}{suffix}")
    return backup


def _open_checked(path: Path) -> ChatStore:
    store = ChatStore(path)
    try:
        if not store.integrity_ok():
            raise sqlite3.DatabaseError("database disk image is malformed (integrity check)")
        store.set_setting("last_opened", time.time())  # a full disk or read-only file fails here
    except BaseException:
        store.close()
        raise
    return store


def _read_only_copy(path: Path) -> ChatStore | None:
    """The chats of a file we may not write, copied into memory; None if it cannot be read."""
    for query in ("mode=ro", "immutable=1"):
        try:
            src = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True)
            try:
                src.execute("SELECT count(*) FROM conversations").fetchone()
                return ChatStore.in_memory(path, copy_of=src)
            finally:
                src.close()
        except (sqlite3.Error, SchemaTooNewError, OSError, ValueError):
            continue
    return None


def _unwritable(path: Path, exc: BaseException) -> tuple[ChatStore, StoreNotice]:
    copy = _read_only_copy(path) if path.is_file() else None
    reason = f"{path} cannot be written ({exc})"
    if copy is not None:
        return copy, StoreNotice("read_only", f"{reason}. Your chats are shown, but nothing "
                                 "new will be saved until the folder is writable and has free "
                                 "space; then restart MTP Chat.")
    return ChatStore.in_memory(path), StoreNotice(
        "unsaved", f"{reason}. Chats in this session will not be saved; free some space or fix "
        "the folder's permissions, then restart MTP Chat.")


def open_chat_store(path_fn: Callable[[], Path]) -> tuple[ChatStore, StoreNotice | None]:
    """Open the chat database at ``path_fn()`` whatever state it is in, losing nothing:
    a corrupt file is moved aside (never deleted) and a fresh one made; a file from a newer
    release is left untouched; an unwritable or full location is opened read-only (in memory)."""
    try:
        path = Path(path_fn())
    except OSError as exc:  # the data folder itself cannot be created
        return ChatStore.in_memory(Path("chats.sqlite3")), StoreNotice(
            "unsaved", f"The data folder cannot be created ({exc}). Chats in this session will "
            "not be saved; check MTPCHAT_HOME or the folder's permissions, then restart.")
    if path.is_dir():
        return ChatStore.in_memory(path), StoreNotice(
            "unsaved", f"{path} is a folder, not a chat database. Chats in this session will not "
            "be saved; move the folder away and restart MTP Chat.")
    try:
        return _open_checked(path), None
    except SchemaTooNewError as exc:
        return ChatStore.in_memory(path), StoreNotice("unsaved", f"{exc} Chats in this session "
                                                      "will not be saved.")
    except (sqlite3.Error, OSError) as exc:
        if not _is_corruption(exc):
            return _unwritable(path, exc)
        log.error("chat database %s is corrupt (%s): moving it aside", path, exc)
    try:
        backup = _move_aside(path)
        store = ChatStore(path)
    except (sqlite3.Error, OSError) as exc:
        return _unwritable(path, exc)
    return store, StoreNotice(
        "recovered", f"The chat database was damaged and could not be read. It was kept as "
        f"{backup.name} (in {backup.parent}) and a new, empty one was started.", backup)
