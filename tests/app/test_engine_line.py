"""The dashboard's engine line: the warm-up's progress and memory against the budget, read from
the scheduler's ``status()``; hidden when there is nothing to say."""
from __future__ import annotations

import pytest

from app.dashboard.engine_line import EngineLine, describe

pytestmark = pytest.mark.gui

STATUS = {"warmup": {"done": 12, "total": 80, "finished": False},
          "memory": {"budget_bytes": 8 * 10**9, "resident_bytes": 2 * 10**9,
                     "reserved_bytes": 512 * 10**6, "base_bytes": 10**9}}


def test_describe():
    text = describe(STATUS)
    assert "Warming up: 12 of 80" in text and "2.0 GB of the 8.0 GB budget (25%" in text
    assert "512.0 MB" in text
    done = {**STATUS, "warmup": {"done": 80, "total": 80, "finished": True}}
    assert "Warming" not in describe(done) and "budget" in describe(done)
    assert describe({}) == ""


def test_line_follows_the_status(qtbot):
    from app.dashboard.window import DashboardWindow

    w = DashboardWindow()
    qtbot.addWidget(w)
    now = {"s": {}}
    w.engine_line.watch(lambda: now["s"])
    assert w.engine_line.isHidden()
    now["s"] = STATUS
    w.engine_line.refresh()
    assert not w.engine_line.isHidden() and "Warming up" in w.engine_line.text()

    def broken():
        raise RuntimeError("gone")
    w.engine_line.watch(broken)
    assert w.engine_line.isHidden()
