"""The model manager's "Add MTP head (N MB)" (pytest-qt, offscreen) against the fake Hub:
offered with the head's real size on a headless conversion LM Studio keeps, run on a worker
with progress, finished with the measured acceptance (the new model appears, LM Studio's
folder untouched), refused in one line when the head does not fit, cancellable."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from engine.hub.store import Store
from tests.fakehub import FakeHub, point_hf_at
from tests.graftrepos import CARD, DEMO_REPO, DENSE_REPO, conversion, fake_repos, tree_hashes
from tests.localdisk import make_lmstudio, point_at

pytestmark = pytest.mark.gui
GiB = 2**30


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from engine.paths import default_model_path
    from tests.tinymodels import build_tiny_model

    work = tmp_path_factory.mktemp("graft-app")
    srcs = {DEMO_REPO: default_model_path(),
            DENSE_REPO: build_tiny_model(work / "dense", seed=3, shards=2)}
    convs = {DEMO_REPO: conversion(srcs[DEMO_REPO], work / "demo-4bit", bits=4),
             DENSE_REPO: conversion(srcs[DENSE_REPO], work / "dense-4bit", bits=4)}
    return srcs, convs


@pytest.fixture
def manager(qtbot, tmp_path, monkeypatch, sources):
    from app.models.window import ModelsWindow

    srcs, convs = sources
    repos = fake_repos(srcs)
    roots = point_at(monkeypatch, tmp_path)
    for repo, name in ((DEMO_REPO, "mlx-community/mtp-demo-4bit"),
                       (DENSE_REPO, "mlx-community/tiny-dense-4bit")):
        folder = make_lmstudio(roots["lmstudio"], name, convs[repo])
        (folder / "README.md").write_text(CARD.format(repo=repo))
    with FakeHub(repos) as h:
        point_hf_at(h, monkeypatch, tmp_path)
        w = ModelsWindow(store=Store(tmp_path / "models"), total_memory=16 * GiB,
                         free_space=lambda p: 10**12, auto_resume=False)
        qtbot.addWidget(w)
        w.show()
        w.tabs.setCurrentIndex(3)
        qtbot.waitUntil(lambda: len(w.installed_panel.external) == 2, timeout=30_000)
        yield w, h, roots
        w.shutdown()


def _select(w, name: str):
    p = w.installed_panel
    p.select_model(name)
    return p.installed_buttons["graft"]


def test_add_mtp_head_offers_runs_and_reports_acceptance(qtbot, manager):
    from engine.hub.graft_source import read_source

    w, _hub, roots = manager
    before = tree_hashes(roots["lmstudio"])
    head = read_source(DEMO_REPO).head_bytes
    b = _select(w, "mlx-community/mtp-demo-4bit")
    assert b.isVisible() and b.isEnabled()
    assert b.text() == f"Add MTP head ({head / 1e6:.1f} MB)"
    assert f"MTP head available from {DEMO_REPO}" in b.toolTip()
    qtbot.mouseClick(b, Qt.MouseButton.LeftButton)
    bar = w.installed_panel.graft_bar
    assert bar.isVisible() and not b.isEnabled()  # one graft at a time
    qtbot.waitUntil(lambda: w.installed_panel.graft_job.state != "running", timeout=60_000)
    assert w.installed_panel.graft_job.state == "done", bar.status.text()
    text = bar.status.text()
    assert text.startswith(f"MTP head added as mlx-community--mtp-demo-4bit-mtp from {DEMO_REPO}")
    assert "acceptance 0." in text and "instead of" in text
    qtbot.waitUntil(lambda: any(r.name == "mlx-community--mtp-demo-4bit-mtp"
                                for r in w.installed_panel.installed), timeout=30_000)
    row = next(r for r in w.installed_panel.installed
               if r.name == "mlx-community--mtp-demo-4bit-mtp")
    assert row.status == "installed" and row.has_mtp
    assert tree_hashes(roots["lmstudio"]) == before
    b = _select(w, "mlx-community--mtp-demo-4bit-mtp")
    assert not b.isVisible()  # it has its head now
    qtbot.waitUntil(lambda: not _select(w, "mlx-community/mtp-demo-4bit").isVisible(),
                    timeout=30_000)  # and the original is not offered again: its copy has it


def test_a_head_that_does_not_fit_is_refused_in_one_line(qtbot, manager):
    w, _hub, _roots = manager
    b = _select(w, "mlx-community/tiny-dense-4bit")
    assert b.isEnabled()
    qtbot.mouseClick(b, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.installed_panel.graft_job.state != "running", timeout=60_000)
    msg = w.installed_panel.graft_bar.status.text()
    assert w.installed_panel.graft_job.state == "failed"
    assert "does not fit this model" in msg and "\n" not in msg
    assert not any(r.has_mtp and r.name.endswith("-mtp") for r in w.installed_panel.installed)


def test_cancel_stops_the_graft_and_keeps_what_was_fetched(qtbot, manager):
    w, hub, _roots = manager
    hub.chunk_size, hub.chunk_delay_s = 8 * 1024, 0.05
    b = _select(w, "mlx-community/mtp-demo-4bit")
    qtbot.mouseClick(b, Qt.MouseButton.LeftButton)
    bar = w.installed_panel.graft_bar
    qtbot.waitUntil(lambda: "Downloading the MTP head" in bar.status.text(), timeout=30_000)
    qtbot.mouseClick(bar.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.installed_panel.graft_job.state != "running", timeout=30_000)
    assert w.installed_panel.graft_job.state == "cancelled"
    assert bar.status.text().startswith("Cancelled — what was fetched is kept")
    hub.chunk_delay_s = 0.0
    hub.wait_idle()
