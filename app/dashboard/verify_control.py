"""The dashboard's "Verify exactness" button and verdict line: starts the engine's exactness
check (``engine.decoding.verify``) on the worker thread, shows its progress, then its
plain-language verdict (green for a pass, red for a fail). One engine job at a time: the
tuner's button is disabled while a check runs, and this button while the tuner runs."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QLabel, QPushButton, QWidget

from app.dashboard.charts import GREEN, RED

VERIFY_TEXT = "Verify exactness"


class VerifyControl(QObject):
    """``button`` and ``label`` (laid out by the dashboard); ``tuning()`` says whether the
    tuner runs, ``enable_tuner(bool)`` enables its button."""

    requested = Signal()
    cancel_requested = Signal()

    def __init__(self, parent: QWidget, *, tuning: Callable[[], bool],
                 enable_tuner: Callable[[bool], None]) -> None:
        super().__init__(parent)
        self._tuning = tuning
        self._enable_tuner = enable_tuner
        self.running = False
        self.result: dict | None = None
        self.button = QPushButton(VERIFY_TEXT, parent)
        self.button.setAccessibleName("Verify that speculation leaves the output unchanged")
        self.button.setToolTip("Checks that replies with speculation are exactly those of "
                               "plain decoding (greedy token for token, sampled by a "
                               "statistical test); about a minute.")
        self.button.clicked.connect(self._clicked)
        self.label = QLabel("", parent)
        self.label.setWordWrap(True)
        self.label.setObjectName("verdict")
        self.label.setAccessibleName("Exactness check")
        self.label.setVisible(False)

    def attach(self, worker) -> None:
        """Run the check on ``worker`` (an ``app.worker.Worker``); its signals come back
        queued to these slots."""
        self.requested.connect(lambda: worker.start_verify())
        # a direct call: the worker thread is busy checking
        self.cancel_requested.connect(lambda: worker.cancel_verify())
        worker.verify_progress.connect(self.on_progress)
        worker.verify_done.connect(self.on_done)
        worker.verify_failed.connect(self.on_failed)

    def tuning_changed(self, on: bool) -> None:
        """The tuner started (this button off) or stopped (on again, unless a check runs)."""
        if on:
            self.button.setEnabled(False)
        elif not self.running:
            self.button.setEnabled(True)

    def _clicked(self) -> None:
        if self.running:
            self.button.setEnabled(False)  # until the check says it stopped
            self.show("Cancelling…", None)
            self.cancel_requested.emit()
        else:
            self._set_running(True)
            self.show("Starting the exactness check…", None)
            self.requested.emit()

    @Slot(int, int, str)
    def on_progress(self, done: int, total: int, message: str) -> None:
        if not self.running:
            self._set_running(True)
        if not self.button.isEnabled():  # cancelling
            return
        step = f" ({done} of {total})" if total else ""
        self.show(f"Checking exactness{step}: {message}" if message
                  else f"Checking exactness{step}…", None)

    @Slot(object)
    def on_done(self, result) -> None:
        r = result.to_dict() if hasattr(result, "to_dict") else dict(result)
        self.result = r
        self._set_running(False)
        if r.get("cancelled"):
            self.show(r.get("message") or "Cancelled: no verdict.", None)
            return
        passed = bool(r.get("passed"))
        text = r.get("message") or ("Exact: speculation leaves the output unchanged." if passed
                                    else "Not exact: speculation changed the output.")
        self.show(text, passed)

    @Slot(str)
    def on_failed(self, message: str) -> None:
        self._set_running(False)
        self.show(f"The exactness check could not run: {message}", False)

    def _set_running(self, on: bool) -> None:
        self.running = on
        self.button.setEnabled(on or not self._tuning())
        self.button.setText("Cancel check" if on else VERIFY_TEXT)
        self.button.setAccessibleName("Cancel the exactness check" if on else
                                      "Verify that speculation leaves the output unchanged")
        self._enable_tuner(not on)

    def show(self, text: str, passed: bool | None) -> None:
        """The check's line: progress (plain), a pass (green) or a fail (red)."""
        self.label.setText(text)
        self.label.setVisible(bool(text))
        self.label.setProperty("verdict", "" if passed is None else "pass" if passed else "fail")
        if passed is None:
            self.label.setStyleSheet("")
        else:
            c = GREEN if passed else RED
            self.label.setStyleSheet(
                f"QLabel#verdict {{ background: rgba({c.red()}, {c.green()}, {c.blue()}, 0.16);"
                f" border: 1px solid {c.name()}; }}")
