"""Issue 16, defects 6 and 11: export errors in a dialog, the export dialog's folder, and
search with snippets, "No matches" and a jump to the match."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from tests.app.chat_fixtures import send

pytestmark = pytest.mark.gui


def test_export_to_a_missing_folder_shows_a_dialog(qtbot, win, tmp_path):
    send(qtbot, win, "export me")
    out = win.chats.export_conversation(win.current_conv, "md", tmp_path / "no" / "such" / "c.md")
    assert out is None
    box = win.findChild(QMessageBox, "errorDialog")
    assert box is not None and box.isVisible() and "could not be exported" in box.text()
    box.close()


def test_export_dialog_opens_in_documents_then_the_last_folder(qtbot, win, tmp_path, monkeypatch):
    from PySide6.QtCore import QStandardPaths

    send(qtbot, win, "export me")
    seen = []
    target = tmp_path / "exports"
    target.mkdir()

    def fake_dialog(parent, caption, start, filt):
        seen.append(Path(start))
        return str(target / Path(start).name), filt

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(fake_dialog))
    win.chats.ask_export(win.current_conv, "md")
    docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    expected = Path(docs) if docs and Path(docs).is_dir() else Path.home()
    assert seen[0].parent == expected and seen[0].name == "export me.md"
    assert (target / "export me.md").is_file()
    win.chats.ask_export(win.current_conv, "json")
    assert seen[1].parent == target  # the last used folder


def test_search_shows_snippets_no_matches_and_jumps_to_the_match(qtbot, win):
    send(qtbot, win, "tell me about penguins")
    for i in range(5):
        send(qtbot, win, f"filler {i}")
    first = win.current_conv
    win.chats.new_chat()
    send(qtbot, win, "something else")
    win.sidebar.search.setText("PENGUINS")
    qtbot.waitUntil(lambda: win.sidebar.ids() == [first], timeout=2000)
    item = win.sidebar.list.item(0)
    from app.chat.sidebar import SUBTITLE_ROLE

    assert "penguins" in item.data(SUBTITLE_ROLE).lower()
    win.sidebar.list.setCurrentRow(0)
    qtbot.waitUntil(lambda: win.current_conv == first, timeout=2000)
    target = next(m for m in win.store.messages(first) if "penguins" in m.content)
    qtbot.waitUntil(lambda: win.view.highlighted == target.id, timeout=2000)
    w = win.view.widgets[target.id]
    bar = win.view.verticalScrollBar()
    # scrolled up to the match, not left at the bottom
    qtbot.waitUntil(lambda: 0 < bar.maximum() and bar.value() < bar.maximum(), timeout=2000)
    qtbot.wait(200)
    assert bar.value() < bar.maximum()
    assert w.visibleRegion().boundingRect().height() > 0
    win.sidebar.search.setText("zzz-nothing-zzz")
    qtbot.waitUntil(lambda: win.sidebar.no_matches.isVisible(), timeout=2000)
    assert "No matches" in win.sidebar.no_matches.text()
    win.sidebar.search.clear()
    qtbot.waitUntil(lambda: not win.sidebar.no_matches.isVisible(), timeout=2000)
