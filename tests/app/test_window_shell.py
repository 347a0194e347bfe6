from __future__ import annotations

import pytest

pytestmark = pytest.mark.gui


def test_main_window_opens_and_closes(qtbot):
    from app.chat.main_window import MainWindow

    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    assert w.windowTitle() == "MTP Chat"
    assert w.close()
