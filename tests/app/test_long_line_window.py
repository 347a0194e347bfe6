"""A long paragraph without line breaks (a pasted log line, minified code) in the composer:
the composer grows to its eight lines and no further, and the window keeps its size. The
composer once measured a line as its first paragraph's height, so one wrapped paragraph of
11,000 characters made it (and, with no window manager to refuse, the window) 10,000 pixels
tall."""
from __future__ import annotations

from app.chat.composer import MAX_LINES

TEXT = "Here is my module. " + " ".join(
    f"def helper_{i // 8}_{i % 8}(x): return x * {i % 7} + {i // 8};" for i in range(300))


def test_a_long_unbroken_paragraph_grows_the_composer_to_its_limit_only(win, qtbot):
    win.resize(1180, 760)
    win.show()
    qtbot.wait(50)
    edit = win.composer.edit
    edit.setPlainText("one line")
    qtbot.wait(50)
    one = edit.height()
    edit.setPlainText(TEXT)
    qtbot.wait(50)
    line = edit.fontMetrics().lineSpacing()
    assert one < edit.height() <= one + (MAX_LINES - 1) * (line + 1)
    assert win.height() == 760 and win.minimumSizeHint().height() < 760
    edit.setPlainText("")
    qtbot.wait(50)
    assert edit.height() == one
