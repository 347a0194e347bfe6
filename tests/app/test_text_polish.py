"""Issue 16, defects 4 and 11: Markdown keeps Python dunder names, buttons and titles show no
raw backticks, "1 draft token" is singular, the composer shows five lines unclipped."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QFont

from app.chat.conversations import make_title
from app.chat.markdown import plain_inline, protect_identifiers

pytestmark = pytest.mark.gui


def _plain(markdown: str) -> str:
    from PySide6.QtGui import QTextDocument

    from app.chat.flow import markdown_html

    doc = QTextDocument()
    doc.setHtml(markdown_html(markdown, font=QFont(), code_bg="#eeeeee"))
    return doc.toPlainText()


@pytest.mark.parametrize("text", [
    "Call it.__next__() to advance.", "Call `it.__next__()` to advance.",
    "Define __init__ and read __name__.", "snake_case_name stays",
])
def test_markdown_keeps_python_names(qapp, text):
    assert _plain(text) == plain_inline(text)


def test_protect_identifiers_leaves_code_and_bold_alone():
    assert protect_identifiers("`__x__` and **b**") == "`__x__` and **b**"
    assert protect_identifiers("a.__next__()") == "a.\\_\\_next\\_\\_()"


def test_titles_and_example_buttons_have_no_backticks(qtbot, tmp_path):
    from app.chat.main_window import DEMO_EXAMPLES, MainWindow

    assert make_title("What does `os.path.join` do?") == "What does os.path.join do?"
    w = MainWindow(db_file=tmp_path / "c.db", autoload=False)
    qtbot.addWidget(w)
    w.view.set_examples("Try:", list(DEMO_EXAMPLES))
    texts = [b.text() for b in w.view.example_buttons]
    assert texts and not any("`" in t for t in texts)
    sent = []
    w.view.example_requested.connect(sent.append)
    w.view.example_buttons[0].click()
    assert sent == [DEMO_EXAMPLES[0]]  # the model still gets the Markdown
    w.close()


def test_one_draft_token_is_singular(qapp):
    from app.chat.settings_dialog import SettingsForm

    form = SettingsForm()
    labels = [form.depth.itemText(i) for i in range(form.depth.count())]
    assert "1 draft token" in labels and "1 draft tokens" not in labels
    assert "2 draft tokens" in labels


@pytest.mark.parametrize("point_size", [0, 15, 22])
def test_composer_shows_five_lines_unclipped(qtbot, point_size):
    from app.chat.composer import Composer

    c = Composer()
    qtbot.addWidget(c)
    if point_size:
        f = c.edit.font()
        f.setPointSize(point_size)
        c.edit.setFont(f)
    c.resize(600, 400)
    c.show()
    c.edit.setPlainText("line 1\nline 2\nline 3\nline 4\nline 5 — ÄÉ gjpq 🙂")
    qtbot.wait(20)
    e = c.edit
    assert e.verticalScrollBar().maximum() == 0
    last = e.blockBoundingGeometry(e.document().lastBlock()).translated(e.contentOffset())
    assert last.bottom() <= e.viewport().height()
