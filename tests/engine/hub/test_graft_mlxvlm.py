"""mlx-vlm's MTP layouts (tests/thirdparty.py writes them as mlx-vlm does): its ``split_mtp`` /
``convert --mtp`` drafter folders attach to a headless conversion with ``graft --from FOLDER``
(or found beside it as ``<model>-mtp``) without any download, and MLX conversions that keep
``mtp.*`` load with their head; greedy MTP equals depth 0 in each."""
from __future__ import annotations

import pytest

import engine
from engine.hub.graft import GraftError, graft
from engine.hub.inspection import inspect_local
from engine.hub.store import Store
from engine.types import SamplingParams
from tests.graftrepos import conversion, tree_hashes
from tests.localdisk import make_lmstudio, point_at
from tests.thirdparty import write_mlx_with_head, write_mlxvlm_drafter
from tests.tinymodels import build_tiny_model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    work = tmp_path_factory.mktemp("mlxvlm")
    demo = engine.default_model_path()
    moe = build_tiny_model(work / "moe", moe=True, seed=4)
    return {
        "demo-4bit": conversion(demo, work / "demo-4bit", bits=4),
        "moe-8bit": conversion(moe, work / "moe-8bit", bits=8),
        "demo-drafter": write_mlxvlm_drafter(demo, work / "demo-drafter"),
        "demo-drafter-8bit": write_mlxvlm_drafter(demo, work / "demo-drafter-8", bits=8),
        "moe-drafter": write_mlxvlm_drafter(moe, work / "moe-drafter"),
        "moe": moe, "work": work,
    }


@pytest.fixture
def disk(tmp_path, monkeypatch):
    roots = point_at(monkeypatch, tmp_path)
    return {"roots": roots, "store": Store(tmp_path / "store")}


def greedy(model, depth: int, n: int = 24) -> list[int]:
    ids = model.chat_ids([{"role": "user", "content": "What does os.getcwd do?"}])
    events = model.generate(ids, max_tokens=n, depth=depth, sampling=SamplingParams(temperature=0))
    return [t for e in events for t in e.token_ids]


def exact(path) -> None:
    m = engine.load(path)
    assert m.mtp is not None
    base = greedy(m, 0)
    for depth in (1, 2, 3):
        assert greedy(m, depth) == base, depth


@pytest.mark.parametrize("drafter", ["demo-drafter", "demo-drafter-8bit"])
def test_mlxvlm_drafter_folder_grafts_offline(built, disk, drafter):
    folder = make_lmstudio(disk["roots"]["lmstudio"], "mlx-community/demo-4bit",
                           built["demo-4bit"])
    before = tree_hashes(disk["roots"]["lmstudio"])
    res = graft(folder, source=str(built[drafter]), store=disk["store"])  # HF_HUB_OFFLINE=1
    assert res.status == "grafted" and res.bytes_downloaded == 0 and res.bits == 8
    assert res.acceptance > 0.7, res.acceptance  # the demo's trained head
    assert tree_hashes(disk["roots"]["lmstudio"]) == before
    exact(res.path)


def test_drafter_beside_the_conversion_is_found(built, disk):
    import shutil

    folder = make_lmstudio(disk["roots"]["lmstudio"], "me/demo-4bit", built["demo-4bit"])
    shutil.copytree(built["demo-drafter"], folder.with_name("demo-4bit-mtp"))
    res = graft(folder, store=disk["store"])
    assert res.source == str(folder.with_name("demo-4bit-mtp")) and res.acceptance > 0.7


def test_moe_drafter_with_per_expert_tensors(built, disk):
    folder = make_lmstudio(disk["roots"]["lmstudio"], "me/moe-8bit", built["moe-8bit"])
    res = graft(folder, source=str(built["moe-drafter"]), store=disk["store"],
                min_acceptance=0.0)  # random weights: the head drafts at chance
    assert res.status == "grafted"
    exact(res.path)


def test_a_drafter_for_another_model_is_refused(built, disk):
    folder = make_lmstudio(disk["roots"]["lmstudio"], "me/demo-4bit", built["demo-4bit"])
    with pytest.raises(GraftError, match=r"drafter moe-drafter is for another model "
                                         r"\(hidden_size is 192 here, 64 there\)"):
        graft(folder, source=str(built["moe-drafter"]), store=disk["store"])
    with pytest.raises(GraftError, match="not an mlx-vlm Qwen3.5 MTP drafter"):
        graft(folder, source=str(built["moe"]), store=disk["store"])


@pytest.mark.parametrize("moe", [False, True])
def test_mlx_conversion_that_keeps_the_head_loads_with_it(built, moe, tmp_path):
    src = built["moe"] if moe else build_tiny_model(tmp_path / "dense", seed=3)
    out = write_mlx_with_head(src, tmp_path / "kept")
    r = inspect_local(out)
    assert r["supported"] and r["has_mtp"] and r["can_speculate"] and r["layout"] == "mlx"
    exact(out)
