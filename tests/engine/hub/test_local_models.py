"""Models already on disk: a fake Hugging Face cache and LM Studio folder, found, inspected,
loaded in place, imported by hard link, and never deleted by accident."""
from __future__ import annotations

import os

import pytest

from engine.errors import ModelLoadError, StoreError
from engine.hub import scan as discovery
from engine.hub.local_models import external_rows, import_model
from engine.hub.store import Store, resolve_model
from tests.localdisk import make_hf_cache, make_lmstudio, make_mtplx, point_at
from tests.tinymodels import build_tiny_model

GiB = 2**30


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("src") / "m", seed=3, shards=2)


@pytest.fixture(scope="module")
def no_mtp(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("src") / "n", seed=1, with_mtp=False)


@pytest.fixture
def disk(tmp_path, monkeypatch, src, no_mtp):
    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    roots = point_at(monkeypatch, tmp_path)
    snap = make_hf_cache(roots["hf"], "Qwen/Tiny-MTP", src)
    lms = make_lmstudio(roots["lmstudio"], "lmstudio-community/Tiny-NoMTP", no_mtp)
    bad = roots["lmstudio"] / "someone" / "Llama"  # not a model this engine runs
    bad.mkdir(parents=True)
    (bad / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], '
                                     '"model_type": "llama"}')
    (bad / "model.safetensors").write_bytes((src / "model-00001-of-00002.safetensors")
                                            .read_bytes())
    return {"snap": snap, "lms": lms, "roots": roots, "store": Store(tmp_path / "store")}


def _rows(disk):
    return {r.name: r for r in external_rows(disk["store"], total_memory=64 * GiB)}


def test_locations_honour_hf_env(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert discovery.hf_cache_dir() == tmp_path / "hfhome" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert discovery.hf_cache_dir() == tmp_path / "c"


def test_found_and_inspected_with_where_they_live(disk):
    rows = _rows(disk)
    hf = rows["Qwen/Tiny-MTP"]
    assert hf.status == "external" and hf.location == "hf-cache" and hf.has_mtp
    assert hf.location_label == "Hugging Face cache" and hf.family == "qwen3_5"
    assert hf.path == str(disk["snap"]) and hf.revision and not hf.deletable
    assert hf.size_bytes > 0 and hf.verdict == "recommended" and hf.memory_needed_bytes
    lm = rows["lmstudio-community/Tiny-NoMTP"]
    assert lm.location == "lmstudio" and lm.status == "external" and lm.has_mtp is False
    bad = rows["someone/Llama"]
    assert bad.status == "unsupported" and "llama" in bad.problem.lower() and not bad.loadable


def test_loaded_in_place_by_repo_id(disk):
    import engine

    assert resolve_model("Qwen/Tiny-MTP", root=disk["store"].root) == disk["snap"]
    before = sorted(p.name for p in disk["roots"]["hf"].rglob("*"))
    m = engine.load(disk["snap"])
    assert m.mtp is not None and m.info.path == str(disk["snap"])
    assert sorted(p.name for p in disk["roots"]["hf"].rglob("*")) == before  # nothing written


def test_snapshot_symlink_outside_its_blobs_is_refused(disk, tmp_path):
    from engine.models.checkpoint import read_checkpoint

    shard = next(disk["snap"].glob("model-00001*"))
    elsewhere = tmp_path / "elsewhere.safetensors"
    elsewhere.write_bytes(shard.resolve().read_bytes())
    shard.unlink()
    shard.symlink_to(elsewhere)
    with pytest.raises(ModelLoadError, match="outside the model folder"):
        read_checkpoint(disk["snap"])


def test_import_hard_links_and_rm_keeps_the_cache(disk):
    store = disk["store"]
    dest, linked, copied = import_model(disk["snap"], store=store)
    assert linked > 0 and copied == 0 and dest.parent == store.root
    shard = next(dest.glob("model-00001*"))
    blob = next(disk["snap"].glob("model-00001*")).resolve()
    assert os.path.samefile(shard, blob) and blob.stat().st_nlink == 2
    row = store.get(dest.name)
    assert row.status == "installed" and row.has_mtp
    store.delete(dest.name)
    assert blob.exists() and blob.stat().st_nlink == 1  # the cache's file is untouched
    assert {r.name for r in external_rows(store)} >= {"Qwen/Tiny-MTP"}


def test_import_copies_when_linking_is_impossible(disk, monkeypatch):
    def no_link(*_a, **_k):
        raise OSError(18, "Invalid cross-device link")  # EXDEV

    monkeypatch.setattr(os, "link", no_link)
    dest, linked, copied = import_model(disk["lms"], store=disk["store"])
    assert linked == 0 and copied > 0
    assert not os.path.samefile(next(dest.glob("*.safetensors")),
                                next(disk["lms"].glob("*.safetensors")))


def test_rm_refuses_external_models_and_says_where(disk, capsys):
    from engine.cli import main

    rc = main(["rm", "Qwen/Tiny-MTP", "--yes", "--models-dir", str(disk["store"].root)])
    err = capsys.readouterr().err
    assert rc == 2 and "Hugging Face cache" in err and "never deletes" in err
    assert "hf cache delete" in err and err.count("\n") == 1
    assert disk["snap"].is_dir() and any(disk["snap"].iterdir())
    with pytest.raises(StoreError, match="no model named"):
        disk["store"].delete(str(disk["snap"]))  # the store never reaches outside itself
    assert disk["snap"].is_dir()


def test_list_shows_external_models(disk, capsys):
    from engine.cli import main

    assert main(["list", "--models-dir", str(disk["store"].root)]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Tiny-MTP" in out and "Hugging Face cache" in out and "LM Studio" in out
    assert "never deletes" in out
    assert main(["list", "--no-scan", "--models-dir", str(disk["store"].root)]) == 0
    assert "Tiny-MTP" not in capsys.readouterr().out


def test_mtplx_folder_and_duplicates(disk, src):
    make_mtplx(disk["roots"]["mtplx"], "youssofal/Tiny", src)
    names = [f.name for f in discovery.scan()]
    assert "youssofal/Tiny" in names and names.count("Qwen/Tiny-MTP") == 1
