"""Schema 3: ``tool`` messages; a schema-2 file (branches, attachments, deleted ids) upgrades
in place with everything kept."""
from __future__ import annotations

import sqlite3

import pytest

from app.db import MIGRATIONS, SCHEMA_VERSION, Attachment, ChatStore


def make_v2(path) -> dict:
    con = sqlite3.connect(str(path), isolation_level=None)
    con.execute("PRAGMA foreign_keys=ON")
    for v in range(2):
        con.execute("BEGIN")
        MIGRATIONS[v](con)
        con.execute(f"PRAGMA user_version = {v + 1}")
        con.execute("COMMIT")
    con.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('old', 1, 1)")
    ins = ("INSERT INTO messages (conversation_id, role, content, created_at, meta, parent_id) "
           "VALUES (1, ?, ?, 1, ?, ?)")
    u = con.execute(ins, ("user", "hi", "{}", None)).lastrowid
    a1 = con.execute(ins, ("assistant", "v1", '{"status": "done"}', u)).lastrowid
    a2 = con.execute(ins, ("assistant", "v2", "{}", u)).lastrowid
    gone = con.execute(ins, ("user", "deleted later", "{}", a2)).lastrowid
    con.execute("DELETE FROM messages WHERE id = ?", (gone,))
    con.execute("UPDATE conversations SET leaf_id = ?", (a2,))
    con.execute("INSERT INTO attachments (message_id, name, content, created_at) "
                "VALUES (?, 'a.txt', 'file text', 1)", (u,))
    con.close()
    return {"user": u, "v1": a1, "v2": a2, "gone": gone}


def test_v2_file_upgrades_in_place(tmp_path):
    path = tmp_path / "chats.sqlite3"
    ids = make_v2(path)
    store = ChatStore(path)
    assert store.schema_version == SCHEMA_VERSION == 4
    assert store.integrity_ok()
    assert [m.content for m in store.messages(1)] == ["hi", "v2"]
    assert store.branch(ids["v2"]).count == 2
    assert store.attachments([ids["user"]])[ids["user"]] == [Attachment("a.txt", "file text")]
    new = store.add_message(1, "tool", "42", meta={"tool_call_id": "c1"})
    assert new > ids["gone"]  # ids are never reused
    assert store.message(new).role == "tool" and store.message(new).parent_id == ids["v2"]
    store.delete_conversation(1)
    store.purge_deleted()
    assert store._db.execute("SELECT count(*) FROM attachments").fetchone()[0] == 0
    store.close()


def test_roles_still_checked(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    cid = store.create_conversation()
    with pytest.raises(sqlite3.IntegrityError):
        store.add_message(cid, "robot", "x")
    store.close()
