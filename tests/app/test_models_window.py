"""The model manager window against the fake Hub (pytest-qt, offscreen)."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel

from app.models.catalog import BUTTONS_COL, VERDICT_COL
from engine.hub.store import Store
from tests.fakehub import VALID_TOKEN, FakeHub, point_hf_at, tiny_repos

pytestmark = pytest.mark.gui

GiB = 2**30
SHARD1 = "model-00001-of-00002.safetensors"


# What a Check imports on its worker thread. A cold venv compiles these on first use (seconds
# under load), which is the app's first-run cost, not what these tests time: import them once
# before any window is made (issue 35: the first Check of a fresh Debian run took > 10 s).
CHECK_IMPORTS = ("engine.hub.inspection", "engine.hub.catalog", "engine.hub.client",
                 "huggingface_hub", "huggingface_hub.file_download")
CHECK_S = 30_000  # ms; a Check is HTTP to a local fake Hub: well under a second when warm


@pytest.fixture
def make_window(qtbot, tmp_path):
    import importlib

    for name in CHECK_IMPORTS:
        importlib.import_module(name)
    made = []

    def make(**kw):
        from app.models.window import ModelsWindow

        kw.setdefault("store", Store(tmp_path / "models"))
        kw.setdefault("total_memory", 16 * GiB)
        kw.setdefault("free_space", lambda path: 10**12)
        kw.setdefault("auto_resume", False)
        kw.setdefault("download_options", {"tick_s": 0.05, "retry_backoff_s": 0.01})
        w = ModelsWindow(**kw)
        qtbot.addWidget(w)
        w.show()
        made.append(w)
        return w

    yield make
    for w in made:
        w.shutdown()


def _click(qtbot, button) -> None:
    assert button.isVisible() and button.isEnabled(), button.text()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def _wait_installed(qtbot, w, job, name: str) -> None:
    """The job finished and the UI heard of it (signals arrive after ``job.state`` changes)."""
    qtbot.waitUntil(lambda: job.state == "done"
                    and any(r.name == name for r in w.installed_panel.installed)
                    and w.downloads.rows[(job.repo_id, job.revision, job.convert_bits)]
                    .buttons["load"].isHidden() is False, timeout=20_000)


def _checked(qtbot, w, repo: str) -> dict:
    w.tabs.setCurrentIndex(1)
    w.add_panel.repo_edit.setText(repo)
    _click(qtbot, w.add_panel.check_button)
    qtbot.waitUntil(lambda: w.add_panel.report is not None or w.add_panel.check_button.isEnabled(),
                    timeout=CHECK_S)
    return w.add_panel.report


def test_catalog_lists_models_with_verdicts_for_this_machine(make_window):
    w = make_window(total_memory=16 * GiB)
    t = w.catalog_panel.table
    rows = {t.item(r, 0).text(): r for r in range(t.rowCount())}
    assert "Qwen/Qwen3.5-0.8B" in rows and "Qwen/Qwen3.6-35B-A3B" in rows

    def verdict(repo):
        return t.cellWidget(rows[repo], VERDICT_COL).findChild(QLabel).text()

    def download_enabled(repo):
        buttons = t.cellWidget(rows[repo], BUTTONS_COL).findChildren(type(w.add_panel.check_button))
        return next(b for b in buttons if b.text() == "Download").isEnabled()

    assert verdict("Qwen/Qwen3.5-0.8B") == "recommended" and download_enabled("Qwen/Qwen3.5-0.8B")
    assert verdict("Qwen/Qwen3.5-27B") == "not enough memory"
    assert not download_enabled("Qwen/Qwen3.5-27B")
    assert "17.2 GB" in w.catalog_panel.machine_label.text()  # issue 35: one unit, decimal GB
    assert {t.item(r, 5).text() for r in range(t.rowCount())} == {"–"}  # bandwidth unknown
    w2 = make_window(total_memory=16 * GiB, free_space=lambda path: 10**9)
    t2 = w2.catalog_panel.table
    assert t2.cellWidget(rows["Qwen/Qwen3.5-4B"], VERDICT_COL).findChild(QLabel).text() == \
        "not enough disk"


def test_catalog_shows_the_estimated_speed_here(make_window):
    """Issue 35: the speed estimated from the measured memory bandwidth is a column, so
    "too slow" comes with its figure."""
    w = make_window(machine={"bandwidth_bytes_per_s": 4e9})
    t = w.catalog_panel.table
    speeds = {t.item(r, 0).text(): t.item(r, 5).text() for r in range(t.rowCount())}
    assert all(s.startswith("≈ ") and s.endswith(" tok/s") for s in speeds.values()), speeds
    small, big = (float(speeds[r].split()[1]) for r in ("Qwen/Qwen3.5-0.8B", "Qwen/Qwen3.5-27B"))
    assert small > big > 0
    assert "4 GB/s measured memory bandwidth" in w.catalog_panel.machine_label.text()


def test_check_runs_off_the_ui_thread_and_flags_missing_mtp(qtbot, fake, make_window):
    w = make_window()
    fake.api_delay_s = 0.4
    ticks = []
    timer = QTimer(w)
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(20)
    w.tabs.setCurrentIndex(1)
    w.add_panel.repo_edit.setText("https://huggingface.co/tiny/no-mtp")
    _click(qtbot, w.add_panel.check_button)
    assert w.add_panel.check_busy.isVisible() and not w.add_panel.check_button.isEnabled()
    qtbot.waitUntil(lambda: w.add_panel.report is not None, timeout=CHECK_S)
    timer.stop()
    assert len(ticks) >= 10  # the event loop kept running during the check
    text = w.add_panel.report_label.text()
    assert "cannot speculate" in text and "--convert --bits 4" in text
    assert w.add_panel.download_button.isEnabled()
    fake.api_delay_s = 0
    r = _checked(qtbot, w, "tiny/llama")
    assert not r["supported"] and not w.add_panel.download_button.isEnabled()
    assert "not supported" in w.add_panel.report_label.text()
    assert _checked(qtbot, w, "tiny/gated") is None
    text = w.add_panel.report_label.text()  # the token is added in the app, not a terminal
    assert "Hugging Face token…" in text and "hf auth login" not in text and "HF_TOKEN" not in text
    assert not w.add_panel.download_button.isEnabled()
    assert _checked(qtbot, w, "not a repo id") is None
    assert "not a Hugging Face model id" in w.add_panel.report_label.text()


def test_download_cancel_resume_install_and_load(qtbot, fake, repos, make_window):
    w = make_window()
    fake.chunk_size = 16 * 1024
    fake.path_delay_s[SHARD1] = 0.02
    r = _checked(qtbot, w, "tiny/mtp")
    assert r["can_speculate"] and w.add_panel.option_combo.currentData() is None
    _click(qtbot, w.add_panel.download_button)
    job = w.downloads.jobs[("tiny/mtp", "main", None)]
    row = w.downloads.rows[("tiny/mtp", "main", None)]
    assert w.tabs.currentIndex() == 2 and w.tabs.tabText(2) == "Downloads (1)"
    qtbot.waitUntil(lambda: job.last is not None and job.last.file == SHARD1
                    and job.last.file_bytes_done > 100_000, timeout=20_000)
    assert "ETA" in row.status.text() and SHARD1 in row.status.text()
    _click(qtbot, row.buttons["cancel"])
    qtbot.waitUntil(lambda: job.state == "cancelled", timeout=10_000)
    assert row.buttons["resume"].isVisible() and "Paused" in row.status.text()
    assert not w.store.path_for("tiny--mtp").exists()
    fake.wait_idle()
    served_before = fake.served_for("tiny/mtp")[SHARD1]
    fake.path_delay_s.clear()
    _click(qtbot, row.buttons["resume"])
    _wait_installed(qtbot, w, job, "tiny--mtp")
    assert fake.served_for("tiny/mtp")[SHARD1] - served_before < len(repos["tiny/mtp"].files[SHARD1])
    assert "Installed" in row.status.text()
    with qtbot.waitSignal(w.load_requested, timeout=2000) as sig:
        _click(qtbot, row.buttons["load"])
    assert sig.args == [str(w.store.path_for("tiny--mtp"))]
    names = [r.name for r in w.installed_panel.installed]
    assert "tiny--mtp" in names


def test_gated_download_explains_the_token_then_retry_works(qtbot, fake, make_window,
                                                             monkeypatch):
    """The row offers "Add token…"; the token is saved and the download retried."""
    w = make_window()
    job = w.start_download("tiny/gated")
    row = w.downloads.rows[("tiny/gated", "main", None)]
    qtbot.waitUntil(lambda: job.state == "failed", timeout=10_000)
    assert "Hugging Face token…" in row.status.text() and "hf auth" not in row.status.text()
    assert row.buttons["retry"].isVisible() and row.buttons["token"].isVisible()
    from PySide6.QtWidgets import QInputDialog

    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: (VALID_TOKEN, True))
    _click(qtbot, row.buttons["token"])  # asks for the token, saves it, retries
    _wait_installed(qtbot, w, job, "tiny--gated")
    from engine.hub import client as hub

    assert hub.saved_token() == VALID_TOKEN


def test_stalled_download_is_shown(qtbot, fake, make_window):
    w = make_window(download_options={"tick_s": 0.05, "stall_after_s": 0.2})
    fake.chunk_size = 200_000
    fake.path_delay_s[SHARD1] = 0.8
    job = w.start_download("tiny/mtp")
    row = w.downloads.rows[("tiny/mtp", "main", None)]
    qtbot.waitUntil(lambda: row.stall.isVisible(), timeout=10_000)
    assert "Stalled" in row.stall.text()
    fake.path_delay_s.clear()
    _wait_installed(qtbot, w, job, "tiny--mtp")
    assert not row.stall.isVisible()


def test_installed_list_load_tune_delete(qtbot, fake, make_window, monkeypatch):
    w = make_window()
    job = w.start_download("tiny/mtp")
    _wait_installed(qtbot, w, job, "tiny--mtp")
    w.tabs.setCurrentIndex(3)
    builtin = next(r for r in w.installed_panel.installed if r.status == "builtin")
    w.installed_panel.select_model(builtin.name)
    assert not w.installed_panel.installed_buttons["delete"].isEnabled()
    w.installed_panel.select_model("tiny--mtp")
    path = str(w.store.path_for("tiny--mtp"))
    with qtbot.waitSignal(w.tune_requested, timeout=2000) as sig:
        _click(qtbot, w.installed_panel.installed_buttons["tune"])
    assert sig.args == [path] and "Tuning" in w.installed_panel.tune_status.text()
    with qtbot.waitSignal(w.load_requested, timeout=2000) as sig:
        _click(qtbot, w.installed_panel.installed_buttons["load"])
    assert sig.args == [path]
    asked = []
    monkeypatch.setattr(w.installed_panel, "ask", lambda title, text: asked.append(text) or False)
    _click(qtbot, w.installed_panel.installed_buttons["delete"])
    assert Path(path).exists() and "tiny--mtp" in asked[0]
    monkeypatch.setattr(w.installed_panel, "ask", lambda title, text: True)
    _click(qtbot, w.installed_panel.installed_buttons["delete"])
    assert not Path(path).exists()
    assert "tiny--mtp" not in [r.name for r in w.installed_panel.installed]


def test_unfinished_download_is_resumed_when_the_window_opens(qtbot, fake, repos, make_window,
                                                              tmp_path):
    from engine.hub.download import Downloader

    store = Store(tmp_path / "models")
    cancel = threading.Event()
    fake.chunk_size = 16 * 1024
    fake.path_delay_s[SHARD1] = 0.01
    Downloader("tiny/mtp", store=store, cancel=cancel, tick_s=0.02,
               progress=lambda p: p.file == SHARD1 and p.file_bytes_done > 50_000 and cancel.set()
               ).run()
    fake.path_delay_s.clear()
    fake.wait_idle()
    fake.reset_counts()
    w = make_window(store=store, auto_resume=True)
    job = w.downloads.jobs[("tiny/mtp", "main", None)]
    _wait_installed(qtbot, w, job, "tiny--mtp")
    served = fake.served_for("tiny/mtp")
    assert served.get("config.json", 0) == 0
    assert served[SHARD1] < len(repos["tiny/mtp"].files[SHARD1])


def _shoot(w, path: Path) -> None:
    """Grab ``w`` to ``path`` and check it is a real rendering of the window: its size, and
    far more than a blank fill (a window that painted nothing grabs as one colour)."""
    shot = w.grab()
    assert shot.save(str(path))
    img = shot.toImage()
    dpr = img.devicePixelRatio()
    assert (round(img.width() / dpr), round(img.height() / dpr)) == (w.width(), w.height())
    small = img.scaled(96, 64)
    colours = {small.pixel(x, y) for x in range(96) for y in range(64)}
    assert len(colours) > 20, f"{path.name}: {len(colours)} colours"


def test_screenshots(qtbot, fake, make_window, tmp_path):
    """Renders the catalog, a check and downloads in progress (saved where
    MTPCHAT_SCREENSHOT_DIR says) and checks each shows what it is meant to."""
    out = Path(os.environ.get("MTPCHAT_SCREENSHOT_DIR") or tmp_path)
    w = make_window(total_memory=24 * GiB, free_space=lambda path: 80 * 10**9,
                    download_options={"tick_s": 0.1, "stall_after_s": 1.0})
    w.resize(1100, 560)
    w.show()
    qtbot.waitExposed(w)
    assert w.tabs.currentWidget() is w.catalog_panel and w.catalog_panel.isVisible()
    _shoot(w, out / "models_catalog.png")
    _checked(qtbot, w, "tiny/no-mtp")
    assert w.add_panel.report_label.isVisible() and "tiny/no-mtp" in w.add_panel.report_label.text()
    _shoot(w, out / "models_check.png")
    fake.chunk_size = 8 * 1024
    fake.path_delay_s[SHARD1] = 0.05
    fake.path_delay_s["model-00002-of-00002.safetensors"] = 3.0
    fake.path_delay_s["model.safetensors"] = 0.02
    paused = w.start_download("tiny/no-mtp")
    qtbot.waitUntil(lambda: paused.last is not None and paused.last.fraction > 0.4,
                    timeout=20_000)
    paused.cancel()
    w.start_download("tiny/gated")
    running = w.start_download("tiny/mtp")
    qtbot.waitUntil(lambda: w.downloads.jobs[("tiny/gated", "main", None)].state == "failed",
                    timeout=10_000)
    qtbot.waitUntil(lambda: running.last is not None and running.last.file == SHARD1
                    and running.last.fraction > 0.2, timeout=20_000)
    qtbot.wait(300)
    rows = [w.downloads.rows[(repo, "main", None)]
            for repo in ("tiny/no-mtp", "tiny/gated", "tiny/mtp")]
    assert all(r.isVisible() for r in rows)
    assert "Paused" in rows[0].status.text() and SHARD1 in rows[2].status.text()
    _shoot(w, out / "models_downloads.png")
    fake.path_delay_s.clear()


def test_the_model_manager_fits_900_px(qtbot, make_window):
    """Issue 35: every tab fits a 900×650 window (long texts wrap, tables scroll)."""
    w = make_window()
    assert w.minimumSizeHint().width() <= 900
    w.resize(900, 650)
    qtbot.wait(20)
    assert w.width() == 900
