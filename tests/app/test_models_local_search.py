"""The model manager's "On this machine" and "Search" views (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from engine.hub.store import Store
from tests.fakehub import FakeHub, FakeRepo, point_hf_at
from tests.localdisk import make_hf_cache, make_lmstudio, point_at
from tests.tinymodels import build_tiny_model

pytestmark = pytest.mark.gui
GiB = 2**30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("t") / "m", seed=3, shards=2)


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch, tiny):
    from app.models.window import ModelsWindow

    roots = point_at(monkeypatch, tmp_path)
    make_hf_cache(roots["hf"], "Qwen/Tiny-MTP", tiny)
    make_lmstudio(roots["lmstudio"], "lmstudio-community/Tiny", tiny)
    made = []

    def make():
        w = ModelsWindow(store=Store(tmp_path / "models"), total_memory=16 * GiB,
                         free_space=lambda p: 10**12, auto_resume=False)
        qtbot.addWidget(w)
        w.show()
        made.append(w)
        return w

    yield make
    for w in made:
        w.shutdown()


def test_on_this_machine_lists_cache_models_and_imports_by_hard_link(qtbot, window):
    w = window()
    assert w.tabs.tabText(3) == "On this machine" and w.tabs.tabText(4) == "Search"
    qtbot.waitUntil(lambda: len(w.installed_panel.external) == 2, timeout=20_000)
    t = w.installed_panel.installed_table
    where = {t.item(r, 0).text(): t.item(r, 1).text() for r in range(t.rowCount())}
    assert where["Qwen/Tiny-MTP"] == "Hugging Face cache"
    assert where["lmstudio-community/Tiny"] == "LM Studio"
    w.installed_panel.select_model("Qwen/Tiny-MTP")
    b = w.installed_panel.installed_buttons
    assert b["load"].isEnabled() and not b["delete"].isEnabled()
    assert "never deletes" in b["delete"].toolTip()
    with qtbot.waitSignal(w.load_requested) as sig:
        qtbot.mouseClick(b["load"], Qt.MouseButton.LeftButton)
    assert "snapshots" in sig.args[0]  # used in place
    qtbot.mouseClick(b["import"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Imported as" in w.installed_panel.tune_status.text(), timeout=20_000)
    assert "hard-linked" in w.installed_panel.tune_status.text()
    assert any(r.name == "Qwen--Tiny-MTP" and r.status == "installed"
               for r in w.installed_panel.installed)


@pytest.fixture
def hub(repos, monkeypatch, tmp_path):
    extra = {rid: FakeRepo(r.files, gated=r.gated, meta={"downloads": 100 - i, "likes": i})
             for i, (rid, r) in enumerate(repos.items()) if rid != "tiny/corrupt"}
    with FakeHub(extra) as h:
        h.search_page_size = 2
        point_hf_at(h, monkeypatch, tmp_path)
        yield h


def test_search_view_pages_checks_and_shows_gated(qtbot, window, hub):
    w = window()
    p = w.search_panel
    p.page_size = 2
    p.query_edit.setText("tiny")
    qtbot.mouseClick(p.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(p.results) == 2, timeout=20_000)
    qtbot.waitUntil(lambda: all(r.has_mtp is not None or r.note for r in p.results),
                    timeout=20_000)
    assert p.more_button.isEnabled()
    qtbot.mouseClick(p.more_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(p.results) == 3 and not p.more_button.isEnabled(),
                    timeout=20_000)  # llama filtered out
    qtbot.waitUntil(lambda: all(r.has_mtp is not None or r.note for r in p.results),
                    timeout=20_000)
    by = {r.repo_id: r for r in p.results}
    assert by["tiny/mtp"].has_mtp and by["tiny/no-mtp"].has_mtp is False
    assert "gated" in by["tiny/gated"].note
    assert p.table.item(0, 1).text() == "yes"


def test_search_offline_message_and_local_list_still_there(qtbot, window, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    w = window()
    p = w.search_panel
    p.query_edit.setText("qwen")
    qtbot.mouseClick(p.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Search failed" in p.status.text(), timeout=20_000)
    assert "still listed" in p.status.text()
    qtbot.waitUntil(lambda: len(w.installed_panel.external) == 2, timeout=20_000)
