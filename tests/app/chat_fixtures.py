"""Helpers for the chat-window tests: a GUI-thread relay for worker signals, a fake-engine
worker, and a main window over a scripted fake model and a temporary database."""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.fake.engine import FakeModel, make_fake_loader
from app.worker import WorkerThread


class Relay(QObject):
    """Receives the worker's signals on the GUI thread (queued, in order) and re-emits them,
    so qtbot waits on signals delivered the way the UI receives them."""

    loading = Signal(str)
    loaded = Signal(object)
    load_failed = Signal(str)
    unloaded = Signal()
    delta = Signal(int, str, object, object)
    stats = Signal(int, object)
    finished = Signal(int, str, object)
    failed = Signal(int, str)
    tune_progress = Signal(int, int, str)
    tune_finished = Signal(object)
    tune_failed = Signal(str)

    def __init__(self, worker) -> None:
        super().__init__()
        self.log: list[tuple] = []
        for name in ("loading", "loaded", "load_failed", "unloaded", "delta", "stats", "finished", "failed",
                     "tune_progress", "tune_finished", "tune_failed"):
            getattr(worker, name).connect(getattr(self, f"on_{name}"))

    def _relay(self, name: str, *args) -> None:
        self.log.append((name, *args))
        getattr(self, name).emit(*args)

    @Slot(str)
    def on_loading(self, text): self._relay("loading", text)  # noqa: E704
    @Slot(object)
    def on_loaded(self, info): self._relay("loaded", info)  # noqa: E704
    @Slot(str)
    def on_load_failed(self, msg): self._relay("load_failed", msg)  # noqa: E704
    @Slot()
    def on_unloaded(self): self._relay("unloaded")  # noqa: E704
    @Slot(int, str, object, object)
    def on_delta(self, rid, text, ids, flags): self._relay("delta", rid, text, ids, flags)  # noqa: E704
    @Slot(int, object)
    def on_stats(self, rid, obj): self._relay("stats", rid, obj)  # noqa: E704
    @Slot(int, str, object)
    def on_finished(self, rid, reason, summary): self._relay("finished", rid, reason, summary)  # noqa: E704
    @Slot(int, str)
    def on_failed(self, rid, msg): self._relay("failed", rid, msg)  # noqa: E704
    @Slot(int, int, str)
    def on_tune_progress(self, d, t, m): self._relay("tune_progress", d, t, m)  # noqa: E704
    @Slot(object)
    def on_tune_finished(self, r): self._relay("tune_finished", r)  # noqa: E704
    @Slot(str)
    def on_tune_failed(self, m): self._relay("tune_failed", m)  # noqa: E704

    def names(self) -> list[str]:
        return [e[0] for e in self.log]


def make_window(qtbot, tmp_path: Path, fake: FakeModel | None = None, *, db_name: str = "chats.db",
                wait_loaded: bool = True):
    from app.chat.main_window import MainWindow

    fake = fake or FakeModel(tokens_per_second=20000)
    model_dir = tmp_path / "fake-model"
    model_dir.mkdir(exist_ok=True)
    w = MainWindow(model_path=str(model_dir), loader=make_fake_loader(fake),
                   db_file=tmp_path / db_name)
    qtbot.addWidget(w)
    w.show()
    if wait_loaded:
        qtbot.waitUntil(lambda: w.model.info is not None, timeout=5000)
    return w


def send(qtbot, w, text: str, *, wait: bool = True, timeout: int = 10000) -> int:
    """Type ``text`` into the composer and press Send; optionally wait for the reply."""
    w.composer.edit.setPlainText(text)
    assert w.composer.button.isEnabled()
    w.composer.button.click()
    rid = max(w.session.streams) if w.session.streams else None
    if wait:
        qtbot.waitUntil(lambda: not w.session.streams, timeout=timeout)
    return rid


def start_worker(fake: FakeModel | None = None):
    fake = fake or FakeModel(tokens_per_second=20000)
    wt = WorkerThread(loader=make_fake_loader(fake))
    return wt, fake


def wait_until(pred, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return pred()
