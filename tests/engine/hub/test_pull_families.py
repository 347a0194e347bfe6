"""``pull --convert`` on the families the streaming converter does not know (GLM-4.x,
DeepSeek-V3, GLM-4.7-Flash, Qwen3-Next): the catalog offers their 4-bit conversion, so the pull
downloads the raw repo whole, converts it with ``engine.models.convert`` and installs a model
that speculates, instead of refusing after the first files. Against the fake Hub (a real HTTP
server) serving a tiny raw checkpoint of each family."""
from __future__ import annotations

import pytest

import engine
from engine.hub.pull import pull, streamable
from engine.hub.store import Store
from tests.fakehub import FakeHub, FakeRepo, point_hf_at
from tests.tinyfamilies import FAMILIES, build_tiny_family
from tests.tinymodels import build_tiny_model


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    base = tmp_path_factory.mktemp("pull-fam")
    out = {f"tiny/{f}": FakeRepo(_files(build_tiny_family(base / f, f, shards=2)))
           for f in FAMILIES}
    out["tiny/qwen3_5"] = FakeRepo(_files(build_tiny_model(base / "qwen3_5")))
    return out


@pytest.fixture
def hub(repos, tmp_path, monkeypatch):
    with FakeHub(repos) as h:
        point_hf_at(h, monkeypatch, tmp_path)
        yield h


def test_only_qwen3_5_streams(hub):
    assert streamable("tiny/qwen3_5", "main", None)
    assert not any(streamable(f"tiny/{f}", "main", None) for f in FAMILIES)
    assert streamable("tiny/missing", "main", None)  # left to the pull, which says why


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
