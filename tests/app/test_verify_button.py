"""The dashboard's "Verify exactness" button over the worker thread and the fake engine.

``engine.decoding.verify.verify`` needs a real model, so it is replaced by a scripted stand-in
that reports progress, honours the cancel Event and returns a real ``VerifyResult``."""
from __future__ import annotations

import threading

import pytest

from app.worker import Worker
from engine.decoding import verify as verify_mod
from engine.decoding.verify import VerifyResult
from tests.app.chat_fixtures import start_worker, wait_until

pytestmark = pytest.mark.gui


class Script:
    """The fake check: ``steps`` progress reports, then a verdict (or a cancelled result)."""

    def __init__(self, passed: bool = True, steps: int = 3, hold: threading.Event | None = None):
        self.passed = passed
        self.steps = steps
        self.hold = hold  # when given, the check waits (for a cancel) after its first step
        self.threads: list[str] = []
        self.calls: list[dict] = []

    def __call__(self, model, *, depth=None, seconds=60.0, progress=None, cancel=None, **kw):
        from PySide6.QtCore import QThread

        self.threads.append(QThread.currentThread())
        self.calls.append({"model": model.info.name, "depth": depth, "seconds": seconds})
        base = {"model": model.info.name, "depth": 3, "sampling": {}, "threshold": 0.001}
        for i in range(self.steps):
            progress(i + 1, self.steps, f"greedy prompt {i + 1}")
            if self.hold is not None:
                self.hold.set()
                while not cancel.is_set():
                    cancel.wait(0.01)
            if cancel.is_set():
                return VerifyResult(**base, cancelled=True, message="Cancelled: no verdict.")
        msg = ("Exact: depth 3 decodes as plain decoding (p = 0.42)." if self.passed else
               "NOT exact: the sampled replies differ from plain decoding (p = 1e-09).")
        return VerifyResult(**base, passed=self.passed, p_value=0.42 if self.passed else 1e-9,
                            replies=100, message=msg)


def _collector(worker):
    """The worker's verify/tune signals as the UI receives them: queued to a GUI-thread
    object (a blocker waiting on the worker's own signal would run on the worker thread)."""
    from PySide6.QtCore import QObject, Slot

    class Collector(QObject):
        def __init__(self) -> None:
            super().__init__()
            self.log: list[tuple] = []

        @Slot(int, int, str)
        def on_progress(self, d, t, m): self.log.append(("progress", d, t, m))  # noqa: E704
        @Slot(object)
        def on_done(self, r): self.log.append(("done", r))  # noqa: E704
        @Slot(str)
        def on_failed(self, m): self.log.append(("failed", m))  # noqa: E704
        @Slot(object)
        def on_tune_finished(self, r): self.log.append(("tune_finished", r))  # noqa: E704
        @Slot(str)
        def on_tune_failed(self, m): self.log.append(("tune_failed", m))  # noqa: E704

        def names(self) -> list[str]:
            return [e[0] for e in self.log]

        def last(self, name: str):
            return next(e for e in reversed(self.log) if e[0] == name)

    c = Collector()
    worker.verify_progress.connect(c.on_progress)
    worker.verify_done.connect(c.on_done)
    worker.verify_failed.connect(c.on_failed)
    worker.tune_finished.connect(c.on_tune_finished)
    worker.tune_failed.connect(c.on_tune_failed)
    return c


@pytest.fixture
def rig(qtbot):
    from app.dashboard.demo import DEMO_INFO
    from app.dashboard.window import DashboardWindow

    wt, _fake = start_worker()
    worker: Worker = wt.worker
    worker.load_model("m")
    assert wait_until(lambda: worker.model_info is not None)
    win = DashboardWindow()
    qtbot.addWidget(win)
    win.set_model_info(DEMO_INFO)
    win.attach_verifier(worker)
    win.show()
    yield win, worker, _collector(worker)
    assert wt.shutdown(timeout_ms=10_000)


def _click(qtbot, button) -> None:
    from PySide6.QtCore import Qt

    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


@pytest.mark.parametrize("passed", [True, False])
def test_button_progress_then_verdict(qtbot, rig, monkeypatch, passed):
    win, worker, got = rig
    script = Script(passed=passed)
    monkeypatch.setattr(verify_mod, "verify", script)
    assert win.verify_button.text() == "Verify exactness"
    _click(qtbot, win.verify_button)
    qtbot.waitUntil(lambda: win.verify_result is not None, timeout=5000)
    progress = [e[1:] for e in got.log if e[0] == "progress"]
    # on the worker thread, never the GUI's
    assert script.threads == [worker.thread()] and worker.thread() is not win.thread()
    assert script.calls[0]["model"] == "fake-mtp-model"
    assert progress == [(1, 3, "greedy prompt 1"), (2, 3, "greedy prompt 2"),
                        (3, 3, "greedy prompt 3")]
    assert win.verify_label.isVisible()
    assert win.verify_label.text() == win.verify_result["message"]
    assert win.verify_label.property("verdict") == ("pass" if passed else "fail")
    from app.dashboard.charts import GREEN, RED

    assert (GREEN if passed else RED).name() in win.verify_label.styleSheet()
    assert win.verify_button.text() == "Verify exactness" and win.tune_button.isEnabled()
    assert worker.busy is None


def test_progress_text_and_cancel(qtbot, rig, monkeypatch):
    win, worker, got = rig
    hold = threading.Event()
    monkeypatch.setattr(verify_mod, "verify", Script(hold=hold))
    _click(qtbot, win.verify_button)
    assert hold.wait(5)
    qtbot.waitUntil(lambda: "greedy prompt 1" in win.verify_label.text(), timeout=5000)
    assert win.verify_label.text().startswith("Checking exactness (1 of 3)")
    assert win.verify_button.text() == "Cancel check"
    assert not win.tune_button.isEnabled()  # one engine job at a time
    _click(qtbot, win.verify_button)
    qtbot.waitUntil(lambda: win.verify_result is not None, timeout=5000)
    assert got.last("done")[1]["cancelled"] and not got.last("done")[1]["passed"]
    assert win.verify_label.text() == "Cancelled: no verdict."
    assert win.verify_label.property("verdict") == ""
    assert win.verify_button.text() == "Verify exactness" and win.verify_button.isEnabled()


def test_refused_while_a_check_or_a_tune_runs(qtbot, rig, monkeypatch):
    win, worker, got = rig
    hold = threading.Event()
    script = Script(hold=hold)
    monkeypatch.setattr(verify_mod, "verify", script)
    assert worker.start_verify()
    assert hold.wait(5)
    assert not worker.start_verify()
    qtbot.waitUntil(lambda: "failed" in got.names(), timeout=5000)
    assert "already running" in got.last("failed")[1]
    worker.start_tune("")
    qtbot.waitUntil(lambda: "tune_failed" in got.names(), timeout=5000)
    assert "exactness check is running" in got.last("tune_failed")[1]
    worker.cancel_verify()
    qtbot.waitUntil(lambda: "done" in got.names(), timeout=5000)
    assert len(script.calls) == 1
    assert wait_until(lambda: worker.busy is None)

    from engine.depth import tuner

    started, release = threading.Event(), threading.Event()

    def slow_tune(model, *, depths, progress, cancel):
        started.set()
        release.wait(5)
        return {"best_depth": 0}

    monkeypatch.setattr(tuner, "tune", slow_tune)
    worker.start_tune("")
    assert started.wait(5)
    got.log.clear()
    assert not worker.start_verify()
    qtbot.waitUntil(lambda: "failed" in got.names(), timeout=5000)
    assert "tuner is running" in got.last("failed")[1]
    release.set()
    qtbot.waitUntil(lambda: "tune_finished" in got.names(), timeout=5000)
    assert wait_until(lambda: worker.busy is None)


def test_an_error_is_shown_in_red(qtbot, rig, monkeypatch):
    win, worker, got = rig
    from engine.errors import GenerationError

    def broken(model, **kw):
        raise GenerationError("fake-mtp-model has no MTP head: it never speculates")

    monkeypatch.setattr(verify_mod, "verify", broken)
    _click(qtbot, win.verify_button)
    qtbot.waitUntil(lambda: win.verify_button.text() == "Verify exactness", timeout=5000)
    assert "no MTP head" in win.verify_label.text()
    assert win.verify_label.property("verdict") == "fail"
    assert worker.busy is None
