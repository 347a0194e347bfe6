"""A full disk during a reply: the reply stays on screen and in memory, a banner says why, the
UI is never stuck, and everything is saved once there is room again (a real tmpfs when the
tests run as root, as CI does)."""
from __future__ import annotations

import sqlite3

import pytest

from app.chat import session as session_mod
from app.fake.engine import DEFAULT_SCRIPT, FakeModel
from tests.app.chat_fixtures import make_window, send
from tests.tmpfs import fill, tmpfs

pytestmark = pytest.mark.gui


def test_disk_full_during_a_reply_keeps_it_and_saves_it_later(qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(session_mod, "RETRY_MS", 100)
    with tmpfs(tmp_path / "mnt") as mnt:
        w = make_window(qtbot, mnt, FakeModel(tokens_per_second=400), db_name="chats.db")
        send(qtbot, w, "first")  # saved normally
        conv = w.current_conv
        before = [(m.role, m.content) for m in w.store.messages(conv)]
        send(qtbot, w, "second", wait=False)
        qtbot.waitUntil(lambda: any(s.content for s in w.session.streams.values()), timeout=5000)
        fill(mnt / "filler")
        qtbot.waitUntil(lambda: not w.session.streams, timeout=20000)
        assert w.session.storage_error is not None
        assert w.storage_banner.isVisible() and "cannot be saved" in w.storage_banner.text()
        # The UI is not stuck: Stop is gone, the full reply is on screen.
        assert not w.session.busy
        reply_id = max(w.view.widgets)
        assert w.view.widgets[reply_id].content == DEFAULT_SCRIPT
        # Space returns: the retry saves the whole reply, the banner goes away.
        (mnt / "filler").unlink()
        qtbot.waitUntil(lambda: w.session.storage_error is None, timeout=5000)
        assert not w.storage_banner.isVisible()
        w.close()
        check = sqlite3.connect(mnt / "chats.db")
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = check.execute("SELECT role, content, meta FROM messages ORDER BY id").fetchall()
        check.close()
        assert [(r, c) for r, c, _ in rows[: len(before)]] == before
        assert rows[-1][1] == DEFAULT_SCRIPT and '"status": "done"' in rows[-1][2]


def test_a_message_that_cannot_be_saved_is_not_sent_and_stays_in_the_composer(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=20000))

    def full(*_a, **_k):
        raise sqlite3.OperationalError("database or disk is full")

    w.conversations.add_user_message = full
    w.composer.edit.setPlainText("keep me")
    w.composer.button.click()
    assert not w.session.streams and not w.session.busy
    assert w.composer.text == "keep me"
    assert "disk is full" in w.storage_banner.text() and w.storage_banner.isVisible()
    w.close()
