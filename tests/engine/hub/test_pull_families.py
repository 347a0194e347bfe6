"""``pull --convert`` on the families the streaming converter does not know (GLM-4.x,
DeepSeek-V3, GLM-4.7-Flash, Qwen3-Next): the catalog offers their 4-bit conversion, so the pull
downloads the raw repo whole, converts it with ``engine.models.convert`` and installs a model
that speculates, instead of refusing after the first files. Against the fake Hub (a real HTTP
server) serving a tiny raw checkpoint of each family."""
from __future__ import annotations

import pytest

import engine
from engine.hub.pull import pull
from engine.hub.store import Store
from engine.hub.stream_convert import NotStreamable, StreamingConvertPull
from tests.fakehub import FakeHub, FakeRepo, point_hf_at
from tests.tinyfamilies import FAMILIES, build_tiny_family


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    base = tmp_path_factory.mktemp("pull-fam")
    out = {f"tiny/{f}": FakeRepo(_files(build_tiny_family(base / f, f, shards=2)))
           for f in FAMILIES}
    return out


@pytest.fixture
def hub(repos, tmp_path, monkeypatch):
    with FakeHub(repos) as h:
        point_hf_at(h, monkeypatch, tmp_path)
        yield h


@pytest.mark.parametrize("family", FAMILIES)
def test_the_streaming_pull_refuses_before_writing_anything(family, hub, tmp_path):
    store = Store(tmp_path / "store")
    with pytest.raises(NotStreamable, match=family):
        StreamingConvertPull(f"tiny/{family}", bits=4, store=store).run()
    written = [p for p in store.root.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert not written, written


@pytest.mark.parametrize("family", FAMILIES)
def test_pull_convert_keeps_the_raw_download_and_converts_it(family, hub, tmp_path):
    store = Store(tmp_path / "store")
    res = pull(f"tiny/{family}", convert_bits=4, store=store)
    assert res.status == "installed" and res.name.endswith("-mlx-4bit")
    names = {m.name for m in store.list(include_builtin=False, include_incomplete=False)}
    assert names == {res.name, res.name.removesuffix("-mlx-4bit")}  # the raw one is kept
    model = engine.load(res.path)
    assert model.info.family == family and model.info.has_mtp
    assert model.info.quantization and model.info.quantization.get("bits") == 4


@pytest.mark.parametrize("family", FAMILIES)
def test_check_before_download_reads_the_family_and_its_head(family, hub):
    from engine.hub.inspection import inspect_repo

    info = inspect_repo(f"tiny/{family}", offer=False)
    assert info["supported"] and info["can_speculate"], info["reasons"]
    assert info["family"] == family and info["mtp_layers"] == 1
    assert info["memory_needed_bytes"] > info["weight_bytes"]  # + caches + slack
