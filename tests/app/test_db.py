"""The SQLite chat store: schema version and migrations, WAL, CRUD, search, soft delete."""
from __future__ import annotations

import sqlite3

import pytest

from app.db import MIGRATIONS, SCHEMA_VERSION, ChatStore, SchemaTooNewError


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path / "chats.db")
    yield s
    s.close()


def test_new_file_is_wal_and_at_the_current_version(store):
    assert store.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    mode = sqlite3.connect(store.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_reopening_keeps_data_and_does_not_migrate_again(tmp_path):
    a = ChatStore(tmp_path / "c.db")
    cid = a.create_conversation(title="Keep me")
    a.add_message(cid, "user", "hello")
    a.close()
    b = ChatStore(tmp_path / "c.db")
    assert [c.title for c in b.conversations()] == ["Keep me"]
    assert [m.content for m in b.messages(cid)] == ["hello"]
    b.close()


def test_a_newer_schema_is_refused_untouched(tmp_path):
    path = tmp_path / "future.db"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.execute("CREATE TABLE keep (x)")
    con.commit()
    con.close()
    with pytest.raises(SchemaTooNewError, match="Update the app"):
        ChatStore(path)
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    con.close()


def test_failed_migration_rolls_back(tmp_path, monkeypatch):
    def broken(db):
        db.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("app.db.MIGRATIONS", [broken])
    with pytest.raises(RuntimeError, match="disk on fire"):
        ChatStore(tmp_path / "m.db")
    con = sqlite3.connect(tmp_path / "m.db")
    assert con.execute("PRAGMA user_version").fetchone()[0] == 0
    assert con.execute("SELECT name FROM sqlite_master WHERE name='half_done'").fetchone() is None
    con.close()


def test_conversations_sorted_by_last_use(store, monkeypatch):
    clock = iter(range(1000, 2000))
    monkeypatch.setattr("app.db.time.time", lambda: float(next(clock)))
    a = store.create_conversation(title="A")
    b = store.create_conversation(title="B")
    assert [c.title for c in store.conversations()] == ["B", "A"]
    store.add_message(a, "user", "bump")
    assert [c.title for c in store.conversations()] == ["A", "B"]
    store.touch(b)
    assert [c.id for c in store.conversations()] == [b, a]


def test_search_titles_and_text_with_like_wildcards_escaped(store):
    a = store.create_conversation(title="Rust lifetimes")
    b = store.create_conversation(title="Dinner")
    store.add_message(b, "assistant", "Use 100% durum wheat_pasta.")
    c = store.create_conversation(title="Other")
    store.add_message(c, "user", "nothing to see")
    assert [x.id for x in store.conversations(search="rust")] == [a]
    assert [x.id for x in store.conversations(search="DURUM")] == [b]
    assert [x.id for x in store.conversations(search="100%")] == [b]
    assert store.conversations(search="e_t") == []  # "_" is literal: "eat" must not match
    assert [x.id for x in store.conversations(search="wheat_pasta")] == [b]


def test_soft_delete_undo_and_purge(store):
    cid = store.create_conversation(title="Doomed")
    store.add_message(cid, "user", "hi")
    store.delete_conversation(cid)
    assert store.conversations() == [] and store.conversation(cid) is None
    store.undelete_conversation(cid)
    assert [c.id for c in store.conversations()] == [cid]
    store.delete_conversation(cid)
    assert store.purge_deleted() == 1
    store.undelete_conversation(cid)
    assert store.conversations() == [] and store.messages(cid) == []


def test_messages_update_and_truncate(store):
    cid = store.create_conversation()
    ids = [store.add_message(cid, r, t) for r, t in
           [("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")]]
    store.update_message(ids[1], content="a1!", meta={"status": "done"})
    assert store.message(ids[1]).content == "a1!" and store.message(ids[1]).meta == {"status": "done"}
    assert store.delete_messages_from(cid, ids[2]) == 2
    assert [m.content for m in store.messages(cid)] == ["q1", "a1!"]


def test_interrupted_streams_are_marked(store):
    cid = store.create_conversation()
    mid = store.add_message(cid, "assistant", "partial", meta={"status": "streaming"})
    done = store.add_message(cid, "assistant", "x", meta={"status": "done", "note": "streaming"})
    assert store.mark_interrupted() == 1
    assert store.message(mid).meta["status"] == "interrupted"
    assert store.message(mid).content == "partial"
    assert store.message(done).meta["status"] == "done"


def test_app_settings(store):
    assert store.get_setting("theme", "system") == "system"
    store.set_setting("theme", "dark")
    store.set_setting("defaults", {"temperature": 0.2})
    assert store.get_setting("theme") == "dark"
    assert store.get_setting("defaults") == {"temperature": 0.2}


def test_ids_are_never_reused(store):
    """A late write for a deleted reply must not land in the reply that replaced it."""
    cid = store.create_conversation()
    store.add_message(cid, "user", "q")
    old = store.add_message(cid, "assistant", "a")
    store.delete_messages_from(cid, old)
    new = store.add_message(cid, "assistant", "b")
    assert new != old
    store.update_message(old, content="late write")
    assert store.message(new).content == "b"
