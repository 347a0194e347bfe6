"""Issue 16, defect 7 and window sizes: the dashboard fits a 1280×800 screen, shows the
session so far when opened late, and shows a tune started elsewhere as running; windows
come back at the size and place they were left."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QRect

from tests.app.chat_fixtures import make_window, send

pytestmark = pytest.mark.gui


def test_every_window_fits_a_1280x800_screen(qtbot, win, monkeypatch):
    from app import window_state

    monkeypatch.setattr(window_state, "available_area", lambda w: QRect(0, 0, 1280, 770))
    dash, models = win.aux.show_dashboard(), win.aux.show_models()
    from app.chat.main_window import DEFAULT_SIZE
    from app.dashboard.window import DEFAULT_SIZE as DASH_SIZE

    for size in (DEFAULT_SIZE, DASH_SIZE, (models.width(), models.height())):
        assert size[0] <= 1280 and size[1] <= 770
    window_state.fit_to_screen(dash, (1360, 940))  # the old size is cut down to the screen
    assert dash.width() <= 1280 - window_state.MARGIN and dash.height() <= 770 - window_state.MARGIN


def test_dashboard_opened_late_shows_the_session_so_far(qtbot, win):
    send(qtbot, win, "one")
    send(qtbot, win, "two")
    dash = win.aux.show_dashboard()
    qtbot.addWidget(dash)
    dash.refresh()
    assert dash.series_sub.text().endswith("in 2 replies")
    assert not dash.series_sub.text().startswith("0 tokens")
    assert dash.last_summary is not None and dash.t_tokens.value.text() != "–"


def test_a_tune_started_from_the_model_manager_shows_as_running(qtbot, win):
    win.aux.on_tune_progress(3, 27, "repeat 1/3, prompt 1/9, depth 2: 50 tok/s")
    dash = win.aux.show_dashboard()  # opened while the tune runs
    qtbot.addWidget(dash)
    dash.refresh()
    assert dash.tune_button.text() == "Cancel tuning"
    assert dash.tuner_sub.text() == "running: 3/27"
    assert dash.status.text() == "tuning"
    win.aux.on_tune_failed("cancelled")
    dash.refresh()
    assert dash.status.text() == "idle" and dash.tune_button.text() == "Run tuner"


def test_windows_come_back_where_they_were_left(qtbot, tmp_path, monkeypatch):
    from app import window_state

    monkeypatch.setattr(window_state, "available_area", lambda w: QRect(0, 0, 1920, 1080))
    w = make_window(qtbot, tmp_path)
    w.resize(740, 610)  # (offscreen, Qt clamps restored windows to an 800×800 screen)
    dash = w.aux.show_dashboard()
    dash.resize(dash.width(), 520)
    qtbot.wait(20)
    w.close()
    w2 = make_window(qtbot, tmp_path)
    assert (w2.width(), w2.height()) == (740, 610)
    dash2 = w2.aux.show_dashboard()
    assert dash2.height() == 520
    w2.close()
