"""Branches instead of loss: Regenerate and Edit keep earlier versions, a "‹ 2/3 ›" switcher
moves between them, the conversation below follows, and all of it survives a restart and an
upgrade of the database from schema 1."""
from __future__ import annotations

import sqlite3

import pytest

from app.db import ChatStore
from app.fake.engine import FakeModel
from tests.app.chat_fixtures import make_window, send

pytestmark = pytest.mark.gui


def _path(w):
    return [(m.role, m.content) for m in w.store.messages(w.current_conv)]


def _regenerate(qtbot, w, fake, script):
    fake.script = script
    last = max(w.view.widgets)
    w.view.widgets[last].regen_button.click()
    qtbot.waitUntil(lambda: not w.session.streams, timeout=5000)


def test_regenerate_keeps_versions_and_the_switcher_moves_between_them(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=20000, script="Answer A.")
    w = make_window(qtbot, tmp_path, fake)
    send(qtbot, w, "q")
    _regenerate(qtbot, w, fake, "Answer B.")
    _regenerate(qtbot, w, fake, "Answer C.")
    assert _path(w) == [("user", "q"), ("assistant", "Answer C.")]
    reply = w.view.widgets[max(w.view.widgets)]
    assert reply.branch_label.text() == "3/3" and reply.branch_label.isVisibleTo(reply)
    assert reply.prev_button.isEnabled() and not reply.next_button.isEnabled()
    reply.prev_button.click()
    assert _path(w) == [("user", "q"), ("assistant", "Answer B.")]
    reply = w.view.widgets[max(w.view.widgets, key=lambda i: w.view.widgets[i].role == "assistant")]
    assert reply.branch_label.text() == "2/3"
    # the model's next prompt follows the version on screen
    fake.script = "Follow-up."
    send(qtbot, w, "more")
    prompt = fake.calls[-1]["prompt_ids"]
    assert prompt == w.worker._model.chat_ids([
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "Answer B."},
        {"role": "user", "content": "more"}])
    w.close()


def test_edit_branches_and_the_conversation_below_follows_across_restart(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=20000, script="R.")
    w = make_window(qtbot, tmp_path, fake)
    send(qtbot, w, "one")
    send(qtbot, w, "two")
    first = w.store.messages(w.current_conv)[0].id
    w.view.widgets[first].edit_button.click()
    w.composer.edit.setPlainText("one, edited")
    w.composer.button.click()
    qtbot.waitUntil(lambda: not w.session.streams, timeout=5000)
    assert [c for _, c in _path(w)] == ["one, edited", "R."]
    conv = w.current_conv
    w.close()

    w2 = make_window(qtbot, tmp_path, fake)  # a restart: same database
    w2.chats.open_conversation(conv)
    assert [c for _, c in _path(w2)] == ["one, edited", "R."]
    top = w2.view.widgets[min(w2.view.widgets)]
    assert top.branch_label.text() == "2/2"
    top.prev_button.click()  # back to the first version: its whole conversation returns
    assert [c for _, c in _path(w2)] == ["one", "R.", "two", "R."]
    assert w2.view.widgets[min(w2.view.widgets)].branch_label.text() == "1/2"
    w2.close()
    w3 = make_window(qtbot, tmp_path, fake)  # the chosen branch is remembered
    w3.chats.open_conversation(conv)
    assert [c for _, c in _path(w3)] == ["one", "R.", "two", "R."]
    w3.close()


def _schema_v1(path) -> None:
    """A database as MTP Chat wrote it before branches (schema 1), with one chat."""
    from app.db import _v0_to_v1

    con = sqlite3.connect(str(path), isolation_level=None)
    _v0_to_v1(con)
    con.execute("PRAGMA user_version = 1")
    con.execute("INSERT INTO conversations (id, title, created_at, updated_at, settings) "
                "VALUES (1, 'Old chat', 1.0, 2.0, '{\"temperature\": 0.3}')")
    for i, (role, text) in enumerate([("user", "hi"), ("assistant", "hello"),
                                      ("user", "bye"), ("assistant", "ciao")]):
        con.execute("INSERT INTO messages (conversation_id, role, content, created_at, meta) "
                    "VALUES (1, ?, ?, ?, '{\"status\": \"done\"}')", (role, text, 10.0 + i))
    con.execute("INSERT INTO app_settings VALUES ('last_model', '\"/m\"')")
    con.close()


def test_upgrade_from_schema_1_keeps_every_chat(tmp_path):
    path = tmp_path / "old.db"
    _schema_v1(path)
    store = ChatStore(path)
    assert store.schema_version == 4  # through 2 (branches), 3 (tool messages), 4 (images)
    msgs = store.messages(1)
    assert [m.content for m in msgs] == ["hi", "hello", "bye", "ciao"]
    assert [m.parent_id for m in msgs] == [None, msgs[0].id, msgs[1].id, msgs[2].id]
    assert msgs[3].meta == {"status": "done"}
    assert store.conversation(1).settings == {"temperature": 0.3}
    assert store.get_setting("last_model") == "/m"
    new = store.add_message(1, "user", "again")  # appends to the old chat's branch
    assert store.message(new).parent_id == msgs[3].id
    store.close()


def test_attachments_round_trip_through_the_database(tmp_path):
    from app.db import Attachment

    store = ChatStore(tmp_path / "c.db")
    cid = store.create_conversation()
    files = [Attachment("notes.md", "# Notes\nhello", "markdown"),
             Attachment("paper.pdf", "Extracted text", "pdf")]
    mid = store.add_message(cid, "user", "read these", attachments=files)
    store.close()
    store = ChatStore(tmp_path / "c.db")
    assert store.attachments([mid]) == {mid: files}
    store.close()
