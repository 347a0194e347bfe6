"""The chat database survives bad rows and bad files: nothing saved is lost, the app can start.

Full-disk and read-only cases use a small tmpfs, mounted when the tests run as root (CI does);
elsewhere they are skipped with the reason.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from app.db import SCHEMA_VERSION, ChatStore, open_chat_store
from tests.tmpfs import fill, remount, tmpfs


def _filled(path: Path, n: int = 40) -> list[str]:
    s = ChatStore(path)
    cid = s.create_conversation(title="Keep me")
    texts = [f"message {i} " + "x" * 200 for i in range(n)]
    for t in texts:
        s.add_message(cid, "user", t)
    s._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()
    return texts


def _open(path: Path):
    return open_chat_store(lambda: path)


def test_a_bad_json_value_in_a_row_does_not_hide_the_others(tmp_path):
    path = tmp_path / "c.db"
    s = ChatStore(path)
    cid = s.create_conversation(title="t")
    good = s.add_message(cid, "user", "hello", meta={"a": 1})
    bad = s.add_message(cid, "assistant", "reply")
    s._db.execute("UPDATE messages SET meta='{not json' WHERE id=?", (bad,))
    s._db.execute("UPDATE conversations SET settings='[1,2]' WHERE id=?", (cid,))
    s._db.execute("INSERT INTO app_settings VALUES ('preferences', 'nope{')")
    s._db.execute("UPDATE messages SET meta='\"streaming\"' WHERE id=?", (good,))
    assert s.mark_interrupted() == 0
    msgs = s.messages(cid)
    assert [m.content for m in msgs] == ["hello", "reply"]
    assert [m.meta for m in msgs] == [{}, {}]
    assert s.conversation(cid).settings == {}
    assert s.get_setting("preferences", "default") == "default"
    # The bad values stay on disk as they were (nothing is rewritten behind the user's back).
    raw = s._db.execute("SELECT meta FROM messages WHERE id=?", (bad,)).fetchone()[0]
    assert raw == "{not json"
    s.close()


@pytest.mark.parametrize("damage", ["random", "truncated", "zeroed_page", "empty_header"])
def test_a_corrupt_file_is_moved_aside_and_a_fresh_one_started(tmp_path, damage):
    path = tmp_path / "chats.sqlite3"
    _filled(path)
    data = path.read_bytes()
    if damage == "random":
        data = os.urandom(len(data))
    elif damage == "truncated":
        data = data[: len(data) // 3]
    elif damage == "zeroed_page":
        data = data[:4096 * 2] + b"\x00" * 4096 + data[4096 * 3:]
    else:
        data = b"\x00" * 100 + data[100:]
    path.write_bytes(data)
    store, notice = _open(path)
    assert notice is not None and notice.kind == "recovered", notice
    assert notice.backup is not None and notice.backup.read_bytes() == data  # kept, not deleted
    assert notice.backup.name in notice.message
    assert store.persistent and store.conversations() == []
    cid = store.create_conversation()
    store.add_message(cid, "user", "works")
    assert store.integrity_ok()
    store.close()


def test_a_newer_schema_is_left_untouched_and_the_app_still_opens(tmp_path):
    path = tmp_path / "chats.sqlite3"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.execute("CREATE TABLE future (x)")
    con.commit()
    con.close()
    before = path.read_bytes()
    store, notice = _open(path)
    assert notice.kind == "unsaved" and "Update the app" in notice.message
    store.add_message(store.create_conversation(), "user", "in memory")
    store.close()
    assert path.read_bytes() == before


def test_a_folder_where_the_database_should_be(tmp_path):
    path = tmp_path / "chats.sqlite3"
    path.mkdir()
    store, notice = _open(path)
    assert notice.kind == "unsaved" and "is a folder" in notice.message
    assert not store.persistent
    store.create_conversation()


def test_a_data_folder_that_cannot_be_created(tmp_path):
    def fails() -> Path:
        raise PermissionError(13, "Permission denied", str(tmp_path / "nope"))

    store, notice = open_chat_store(fails)
    assert notice.kind == "unsaved" and "Permission denied" in notice.message
    store.create_conversation()


def test_a_read_only_location_shows_the_chats_without_saving(tmp_path):
    with tmpfs(tmp_path / "mnt", "512k") as mnt:  # schema 2: more tables and indexes
        path = mnt / "chats.sqlite3"
        texts = _filled(path, n=5)
        remount(mnt, "ro")
        store, notice = _open(path)
        assert notice.kind == "read_only", notice
        cid = store.conversations()[0].id
        assert [m.content for m in store.messages(cid)] == texts
        store.add_message(cid, "user", "kept in memory only")  # the app keeps working
        store.close()


def test_a_full_disk_at_start_opens_read_only_and_loses_nothing(tmp_path):
    with tmpfs(tmp_path / "mnt", "512k") as mnt:
        path = mnt / "chats.sqlite3"
        texts = _filled(path, n=5)
        fill(mnt / "filler")
        store, notice = _open(path)
        assert notice is not None and notice.kind in ("read_only", "unsaved"), notice
        assert "cannot be written" in notice.message
        if notice.kind == "read_only":
            assert [m.content for m in store.messages(store.conversations()[0].id)] == texts
        store.close()
        (mnt / "filler").unlink()
        check = sqlite3.connect(path)
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert check.execute("SELECT count(*) FROM messages").fetchone()[0] == len(texts)
        check.close()
