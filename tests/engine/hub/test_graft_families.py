"""``engine graft`` for every family behind the seam, against the fake Hub (a real HTTP
server): a tiny random checkpoint of each family in its raw Hugging Face layout is the source
repo, its headless ``mlx_lm.convert`` conversion (4-bit, its head dropped: ``mtp.*`` for
Qwen3-Next, the nextn layer ``model.layers.{N}.*`` for GLM-4.x / GLM-4.7-Flash / DeepSeek-V3)
sits in a fake LM Studio folder with a card naming the source. The graft fetches only the
head's byte ranges (for nextn, without the layer's copies of the embedding and LM head), the
grafted model speculates exactly (greedy depths 1-3 = depth 0), the other app's folder is never
written, and a source that is another checkpoint of the same shape is refused before any head
byte."""
from __future__ import annotations

import pytest

import engine
from engine.hub.graft import GraftError, graft
from engine.hub.graft_fetch import plan_spans
from engine.hub.graft_source import read_source
from engine.hub.store import Store
from engine.types import SamplingParams
from tests.fakehub import FakeHub, FakeRepo, point_hf_at
from tests.graftrepos import CARD, conversion, tree_hashes
from tests.localdisk import make_lmstudio, point_at
from tests.tinyfamilies import FAMILIES, MLA, NEXTN, build_tiny_family


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """family -> (source folder, another source of the same shape, the 4-bit conversion)."""
    base = tmp_path_factory.mktemp("graft-fam")
    out = {}
    for fam in FAMILIES:
        src = build_tiny_family(base / f"{fam}-src", fam, seed=1, shards=2)
        other = build_tiny_family(base / f"{fam}-other", fam, seed=2, shards=2)
        conv_from = src
        if fam in MLA:  # mlx-lm's sanitize drops model.layers.61 / .47 by number, so the
            # tiny model's nextn layer (model.layers.3) is left out here as it is there
            conv_from = build_tiny_family(base / f"{fam}-headless", fam, seed=1,
                                          with_mtp=False)
        out[fam] = (src, other, conversion(conv_from, base / f"{fam}-4bit", bits=4))
    return out


@pytest.fixture
def env(made, tmp_path, monkeypatch):
    repos = {}
    for fam, (src, other, _) in made.items():
        repos[f"tiny/{fam}-src"] = FakeRepo(_files(src))
        repos[f"tiny/{fam}-other"] = FakeRepo(_files(other))
    with FakeHub(repos) as h:
        point_hf_at(h, monkeypatch, tmp_path)
        roots = point_at(monkeypatch, tmp_path)
        yield {"hub": h, "roots": roots, "store": Store(tmp_path / "store")}


def _place(env, made, fam):
    folder = make_lmstudio(env["roots"]["lmstudio"], f"mlx-community/{fam}-4bit", made[fam][2])
    (folder / "README.md").write_text(CARD.format(repo=f"tiny/{fam}-src"))
    return folder


def _greedy(model, depth: int, n: int = 16) -> list[int]:
    ids = model.chat_ids([{"role": "user", "content": "What does json.dumps do?"}])
    return [t for e in model.generate(ids, max_tokens=n, depth=depth,
                                      sampling=SamplingParams(temperature=0))
            for t in e.token_ids]


@pytest.mark.parametrize("family", FAMILIES)
def test_graft_fetches_only_the_head_and_speculates_exactly(family, made, env):
    folder = _place(env, made, family)
    assert not engine.load(folder).info.has_mtp  # mlx_lm.convert dropped the head
    repo = f"tiny/{family}-src"
    src = read_source(repo)
    names = src.head_names
    if family in NEXTN:
        n = src.text["num_hidden_layers"]
        assert names and all(k.startswith(f"model.layers.{n}.") for k in names)
        assert not any(k.endswith(("embed_tokens.weight", "shared_head.head.weight"))
                       for k in names)  # the copies are not fetched
    else:
        assert names and all(k.startswith("mtp.") for k in names)
    before = tree_hashes(env["roots"]["lmstudio"])
    env["hub"].reset_counts()
    res = graft(folder, store=env["store"], min_acceptance=0.0)  # random heads: acceptance ~0
    assert res.status == "grafted" and res.mode == "linked" and res.source == repo
    served = sum(env["hub"].served_for(repo).values())
    assert res.bytes_fetched == res.head_bytes == src.head_bytes > 0
    assert res.head_bytes <= served <= (res.head_bytes + res.metadata_bytes) * 1.05
    assert served < res.repo_bytes / 2  # the head, not the repo
    assert tree_hashes(env["roots"]["lmstudio"]) == before  # LM Studio's folder untouched
    m = engine.load(res.path)
    assert m.mtp is not None and m.info.has_mtp
    proj = m.mtp.fc if family == "qwen3_next" else m.mtp.eh_proj
    assert res.bits == 8 and proj.bits == 8  # the head at 8 bits on a 4-bit trunk
    if family in NEXTN:  # the experts too; the router stays as it was
        assert m.mtp.layers[0].mlp.switch_mlp.gate_proj.bits == 8
    base = _greedy(m, 0)
    assert base == _greedy(engine.load(folder), 0)  # the same trunk
    for depth in (1, 2, 3):
        assert _greedy(m, depth) == base, depth


@pytest.mark.parametrize("family", FAMILIES)
def test_another_checkpoint_of_the_same_shape_is_refused_before_any_head_byte(family, made,
                                                                              env):
    folder = _place(env, made, family)
    other = f"tiny/{family}-other"
    spans = [(s.file, s.start, s.end) for s in plan_spans(read_source(other))]
    env["hub"].reset_counts()
    with pytest.raises(GraftError, match=rf"not {other}'s \(.*differs") as err:
        graft(folder, source=other, store=env["store"], min_acceptance=0.0)
    assert "\n" not in str(err.value)
    for r in env["hub"].requests:  # no Range request touched a head span
        if f"/{other}/resolve/" in r["path"] and r.get("range"):
            a, _, b = r["range"][6:].partition("-")
            path = r["path"].split("/resolve/", 1)[1].split("/", 1)[1]
            assert not any(f == path and int(a) < e and int(b) + 1 > s for f, s, e in spans)
    assert not env["store"].path_for(f"mlx-community--{family}-4bit-mtp").exists()


@pytest.mark.parametrize("bits", [None, 8])
def test_mlxvlm_glm4_moe_lite_drafter_grafts_offline(bits, made, env, tmp_path):
    """mlx-vlm's GLM-4.7-Flash drafter folder (the nextn layer flattened, bf16 or quantized)
    attaches to the headless conversion with ``--from FOLDER``; nothing is downloaded."""
    from tests.thirdparty import write_glm4_moe_lite_drafter

    drafter = write_glm4_moe_lite_drafter(made["glm4_moe_lite"][0], tmp_path / "drafter",
                                          bits=bits)
    folder = _place(env, made, "glm4_moe_lite")
    env["hub"].reset_counts()
    res = graft(folder, source=str(drafter), store=env["store"], min_acceptance=0.0)
    assert res.status == "grafted" and res.bytes_fetched == 0 and not env["hub"].requests
    m = engine.load(res.path)
    assert m.info.has_mtp and m.mtp is not None
    assert getattr(m.mtp.eh_proj, "bits", None) == bits  # the drafter's packing, as published
    base = _greedy(m, 0)
    assert base == _greedy(engine.load(folder), 0)
    for depth in (1, 3):
        assert _greedy(m, depth) == base, depth


def test_a_drafter_for_another_family_is_refused_in_one_line(made, env, tmp_path):
    from tests.thirdparty import write_glm4_moe_lite_drafter

    drafter = write_glm4_moe_lite_drafter(made["glm4_moe_lite"][0], tmp_path / "drafter")
    with pytest.raises(GraftError, match="not an mlx-vlm Qwen3.5 MTP drafter") as err:
        graft(_place(env, made, "qwen3_next"), source=str(drafter), store=env["store"])
    assert "\n" not in str(err.value)
