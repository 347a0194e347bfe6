"""A dashboard opened while a tune or an exactness check already runs shows its progress
(and the other job's button off), not an idle panel (issue 35)."""
from __future__ import annotations

import threading

import pytest

from engine.decoding import verify as verify_mod
from engine.decoding.verify import VerifyResult
from engine.depth import tuner
from tests.app.chat_fixtures import make_window

pytestmark = pytest.mark.gui


def test_a_tune_started_in_the_model_manager_shows_in_a_dashboard_opened_later(
        qtbot, tmp_path, monkeypatch):
    started, release = threading.Event(), threading.Event()

    def slow_tune(model, *, depths, progress, cancel):
        progress(1, 4, "depth 1: 3 replies")
        started.set()
        release.wait(10)
        return {"best_depth": 0}

    monkeypatch.setattr(tuner, "tune", slow_tune)
    w = make_window(qtbot, tmp_path)
    try:
        w.aux.show_models().tune_requested.emit("")
        assert started.wait(5)
        qtbot.waitUntil(lambda: w.aux.tuning is not None and w.aux.tuning[0] == 1, timeout=5000)
        dash = w.aux.show_dashboard()
        assert dash.tuner_chart.empty_text == "Measuring depths… 1 of 4 runs done"
        assert dash.tuner_message.text() == "depth 1: 3 replies"
        assert dash.tune_button.text() == "Cancel tuning"
        assert not dash.verify_button.isEnabled()  # one engine job at a time
    finally:
        release.set()
        qtbot.waitUntil(lambda: w.worker.busy is None, timeout=10000)
        w.close()


def test_a_check_already_running_shows_in_a_dashboard_opened_later(qtbot, tmp_path, monkeypatch):
    hold, release = threading.Event(), threading.Event()

    def slow_check(model, *, depth=None, seconds=60.0, progress=None, cancel=None, **kw):
        progress(2, 5, "greedy prompt 2")
        hold.set()
        release.wait(10)
        return VerifyResult(model=model.info.name, depth=3, sampling={}, threshold=0.001,
                            passed=True, p_value=0.5, replies=10, message="Exact.")

    monkeypatch.setattr(verify_mod, "verify", slow_check)
    w = make_window(qtbot, tmp_path)
    try:
        assert w.worker.start_verify()  # e.g. from a dashboard closed since
        assert hold.wait(5)
        qtbot.waitUntil(lambda: w.aux.verifying is not None, timeout=5000)
        assert not w.worker.start_verify()  # refused: the first one still runs
        qtbot.wait(50)
        assert w.aux.verifying == (2, 5, "greedy prompt 2")
        dash = w.aux.show_dashboard()
        assert dash.verify_label.isVisible()
        assert dash.verify_label.text().startswith("Checking exactness (2 of 5)")
        assert dash.verify_button.text() == "Cancel check"
        assert not dash.tune_button.isEnabled()
        release.set()
        qtbot.waitUntil(lambda: dash.verify_result is not None, timeout=5000)
        assert dash.verify_label.text() == "Exact." and w.aux.verifying is None
    finally:
        release.set()
        qtbot.waitUntil(lambda: w.worker.busy is None, timeout=10000)
        w.close()
