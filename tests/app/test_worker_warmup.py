"""The worker warms a real model's batch shapes in the background after it loads, one step per
event-loop turn, and reports it (``warmup_progress``) until done."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.timeout(120)]


def test_worker_warms_a_loaded_model_in_the_background(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_WARMUP", "1")  # tests/conftest.py turns it off for the others
    import engine
    from app.worker import WorkerThread
    from tests.app.chat_fixtures import Relay
    from tests.tinymodels import build_tiny_model

    folder = build_tiny_model(tmp_path / "m", seed=3)
    wt = WorkerThread(loader=lambda path: engine.load(path))
    relay = Relay(wt.worker)
    seen: list[tuple[int, int]] = []
    wt.worker.warmup_progress.connect(lambda d, t: seen.append((d, t)))
    try:
        with qtbot.waitSignal(relay.loaded, timeout=60_000):
            wt.worker.load_model(str(folder))
        qtbot.waitUntil(lambda: bool(seen) and seen[-1][0] == seen[-1][1], timeout=90_000)
        warm = wt.worker.scheduler.warmup
        assert warm is not None and warm.finished and warm.done == warm.total > 0
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    finally:
        assert wt.shutdown(timeout_ms=30_000)
