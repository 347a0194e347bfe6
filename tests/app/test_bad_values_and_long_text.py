"""Hostile values the chat must survive: a bad field in a sound database (read as absent,
reported once with the chat's name), a message of megabytes (its first part rendered, the
whole one click away), Markdown that once took cubic time to scan."""
from __future__ import annotations

import math
import time

import pytest

from app.chat.markdown import (
    HARD_LIMIT,
    PREVIEW_CHARS,
    preview_cut,
    protect_identifiers,
    split_blocks,
)
from app.chat.settings import ChatSettings
from app.chat.settings_dialog import AppPreferences
from app.chat.stats_line import format_stats
from app.db import ChatStore


@pytest.mark.parametrize("value", [1e300, float("inf"), float("nan"), -1, "x", [1], True, None])
def test_a_numeric_setting_out_of_any_range_falls_back_and_is_named(value):
    s, bad = ChatSettings.parse({"top_k": value, "temperature": 0.3})
    assert s.top_k == ChatSettings().top_k and s.temperature == 0.3
    assert bad == ["top_k"]


def test_settings_that_are_not_an_object_fall_back():
    assert ChatSettings.parse([1, 2]) == (ChatSettings(), ["all"])
    assert ChatSettings.parse({"max_tokens": 48, "system_prompt": "hi"})[0].max_tokens == 48


def test_preferences_with_bad_values_fall_back():
    assert AppPreferences.from_dict({"font_size": 1e300, "theme": ["x"]}) == AppPreferences()
    assert AppPreferences.from_dict(5) == AppPreferences()  # type: ignore[arg-type]
    assert AppPreferences.from_dict({"font_size": 14}).font_size == 14


@pytest.mark.parametrize("stats", ["x", 5, [1], {"tokens": "x", "tokens_per_s": "fast",
                                                  "ttft_s": [], "cycles": None}])
def test_the_stats_line_reads_bad_figures_as_absent(stats):
    line = format_stats(stats)
    assert "tok/s" not in line and "TTFT" not in line


def _store(tmp_path):
    s = ChatStore(tmp_path / "c.db")
    cid = s.create_conversation(title="Victim")
    mid = s.add_message(cid, "assistant", "reply", meta={"status": "done"})
    return s, cid, mid


@pytest.mark.parametrize("meta", ['{"a":' * 100_000 + "1" + "}" * 100_000,
                                  '{"stats": "x", "status": "done"}',
                                  '{"draft_spans": [[1, "b"]], "think_s": "x", "model": 3}'])
def test_a_bad_message_meta_is_read_as_absent_and_reported_once(tmp_path, meta):
    s, cid, mid = _store(tmp_path)
    s._db.execute("UPDATE messages SET meta=? WHERE id=?", (meta, mid))
    seen = []
    s.on_problem = lambda conv, text: seen.append((conv, text))
    for _ in range(3):
        msg = s.messages(cid)[0]
    assert all(k not in msg.meta for k in ("stats", "draft_spans", "think_s", "model"))
    assert len(seen) == 1 and seen[0][0] == cid and "Victim" in seen[0][1]
    assert s._db.execute("SELECT meta FROM messages WHERE id=?", (mid,)).fetchone()[0] == meta
    s.close()


def test_timestamps_that_are_not_numbers_read_as_zero(tmp_path):
    s, cid, mid = _store(tmp_path)
    s._db.execute("UPDATE conversations SET created_at='abc', updated_at=x'00' WHERE id=?",
                  (cid,))
    s._db.execute("UPDATE messages SET created_at='abc' WHERE id=?", (mid,))
    conv = s.conversations()[0]
    assert conv.created_at == 0.0 and conv.updated_at == 0.0
    assert s.messages(cid)[0].created_at == 0.0
    assert [p[0] for p in s.problems] == [cid, cid, cid]
    s.close()


def test_a_preview_reads_only_the_start_of_a_long_message(tmp_path):
    s, cid, mid = _store(tmp_path)
    s.update_message(mid, content="é" * 300_000)
    m = s.messages(cid, preview=1000)[0]
    assert m.content == "é" * 1000 and m.full_length == 300_000
    assert s.messages(cid)[0].full_length is None and len(s.messages(cid)[0].content) == 300_000
    assert s.path_ids(cid) == [mid] and s.parents(cid) == {mid: None}
    s.close()


def test_markdown_scanning_is_bounded():
    for text in ("`" * 100_000 + "a", "`a" * 50_000, "__a" + "_a" * 50_000):
        t0 = time.thread_time()  # the work done: CPU time, which other processes do not inflate
        protect_identifiers(text)
        assert time.thread_time() - t0 < 1.0  # it was 33 s for 16,000 backticks
    blocks = split_blocks("x" * 40_000 + "\n\n" + ("word " * 30 + "\n") * 2000)
    assert max(b.end - b.start for b in blocks) <= HARD_LIMIT
    assert "".join(b.text for b in blocks).count("x") == 40_000


def test_preview_cut_prefers_a_paragraph_end():
    text = ("para " * 40 + "\n\n") * 2000
    cut = preview_cut(text)
    assert PREVIEW_CHARS * 0.9 <= cut <= PREVIEW_CHARS and text[:cut].endswith("\n\n")
    assert preview_cut("short") == 5
    assert preview_cut("y" * (PREVIEW_CHARS + 5)) == PREVIEW_CHARS


@pytest.mark.parametrize("role", ["user", "assistant"])
def test_a_5_mb_message_shows_its_start_and_the_whole_on_request(win, qtbot, role):
    from PySide6.QtGui import QGuiApplication

    line = "A line of a long pasted log, with `code` and **bold**.\n"
    big = "# Log\n\n" + (line * 8 + "\n") * 12_000
    assert len(big) > 5_000_000
    cid = win.conversations.current
    mid = win.store.add_message(cid, role, big)
    t0 = time.thread_time()  # the GUI thread's CPU time: a loaded machine does not inflate it
    win.chats.open_conversation(cid)
    qtbot.wait(10)
    took = time.thread_time() - t0
    w = win.view.widgets[mid]
    assert len(w.shown) <= PREVIEW_CHARS and big.startswith(w.shown)
    assert len(w.content) <= PREVIEW_CHARS + 1  # only the start was read from SQLite
    assert w.more_button.isVisible() and "MB" in w.more_button.text()
    assert took < 2.0, f"opening took {took:.1f} s"
    dialog = w.show_full()
    assert dialog.edit.toPlainText() == big
    w.copy()
    assert len(QGuiApplication.clipboard().text()) == len(big.strip())
    path = win.store.path.parent / "saved.txt"
    assert dialog.save(path) and path.read_text(encoding="utf-8") == big
    dialog.close()


def test_a_short_message_has_no_show_full_button(win, qtbot):
    cid = win.conversations.current
    mid = win.store.add_message(cid, "user", "hi")
    win.chats.open_conversation(cid)
    assert not win.view.widgets[mid].more_button.isVisible()


def test_the_window_names_a_chat_with_a_damaged_value(win, qtbot):
    cid = win.conversations.create()
    win.store.rename_conversation(cid, "Broken one")
    mid = win.store.add_message(cid, "assistant", "x", meta={"status": "done"})
    win.store._db.execute("UPDATE messages SET meta='{\"stats\": 1}' WHERE id=?", (mid,))
    win.chats.open_conversation(cid)
    assert win.data_notice_box.isVisible()
    assert "Broken one" in win.data_notice.text() and "stats" in win.data_notice.toolTip()
    assert math.isfinite(win.store.messages(cid)[0].created_at)


def test_screenshot_of_a_long_message(win, qtbot, tmp_path):
    """The window with a truncated 5 MB reply (``MTPCHAT_SHOTS=folder`` keeps the PNG)."""
    import os
    from pathlib import Path

    cid = win.conversations.current
    win.store.rename_conversation(cid, "Huge paste")
    win.store.add_message(cid, "user", "Summarise this log")
    big = ("2026-01-01 12:00:00 INFO worker: step done in 12 ms, `queue=3`\n" * 6 + "\n") * 14_000
    mid = win.store.add_message(cid, "assistant", big, meta={"status": "done"})
    win.chats.open_conversation(cid)
    win.resize(1180, 760)
    win.view.ensureWidgetVisible(win.view.widgets[mid].more_button)
    qtbot.wait(300)
    out = Path(os.environ.get("MTPCHAT_SHOTS") or tmp_path) / "long-message.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    assert win.grab().save(str(out)) and out.stat().st_size > 10_000
    dialog = win.view.widgets[mid].show_full()
    qtbot.wait(200)
    assert dialog.grab().save(str(out.with_name("long-message-full.png")))
    dialog.close()
    win.store._db.execute("UPDATE conversations SET settings='{\"top_k\": 1e300}' WHERE id=?",
                          (cid,))
    win.chats.open_conversation(cid)
    qtbot.wait(100)
    assert win.data_notice_box.isVisible()
    assert win.grab().save(str(out.with_name("damaged-value-notice.png")))
