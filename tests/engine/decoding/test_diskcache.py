"""The prompt cache on disk: exact resumes (depth 0 and 2, after a reload), the MTP invariant
after a resume, the LRU size bound, corrupt and foreign files ignored, the off switch."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import engine
from engine.core.carryover import carryover_of
from engine.decoding import diskcache
from engine.decoding.session import Session
from tests.engine.decoding.test_decode import (
    _fresh_logits_and_mtp, _mtp_invariant_holds, draft_one, run,
)


def _disk(model, root, *, min_tokens=64, max_bytes=1 << 30):
    kinds = {"trunk": diskcache.cache_kinds(model.trunk.make_cache()),
             "mtp": diskcache.cache_kinds(model.mtp.make_cache() if model.mtp else None)}
    key = diskcache.model_key(model.info.path, model.info.dtype, [kinds["trunk"], kinds["mtp"]])
    return diskcache.DiskPromptCache(root, key, kinds, max_bytes=max_bytes, min_tokens=min_tokens)


@pytest.fixture
def disk_model(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(carryover_of(tiny_model), "disk_cache", _disk(tiny_model, tmp_path / "pc"))
    carryover_of(tiny_model).reset_prompt_cache()
    return tiny_model


def long_prompt(n=200, seed=0):
    return np.random.default_rng(seed).integers(3, 380, size=n).tolist()


def _plain(model, prompt, depth, max_tokens=24):
    disk, carryover_of(model).disk_cache = carryover_of(model).disk_cache, None
    try:
        return run(model, prompt, depth=depth, max_tokens=max_tokens).token_ids
    finally:
        carryover_of(model).disk_cache = disk


def _resumed(model, prompt, depth, max_tokens=24):
    carryover_of(model).reset_prompt_cache()
    evs = list(model.generate(prompt, max_tokens=max_tokens, depth=depth))
    return evs[0].prefill.reused_tokens, [t for e in evs for t in e.token_ids]


@pytest.mark.parametrize("depth", [0, 2])
def test_resume_from_disk_is_exact(disk_model, depth):
    p = long_prompt(seed=depth)
    first = run(disk_model, p, depth=depth, max_tokens=24)
    carryover_of(disk_model).disk_cache.flush()
    reused, toks = _resumed(disk_model, p, depth)
    assert reused == len(p)
    assert toks == first.token_ids == _plain(disk_model, p, depth)
    follow = p + first.token_ids + [11, 12, 13]   # the next turn of the conversation
    reused, toks = _resumed(disk_model, follow, depth)
    assert reused >= len(p) + len(first.token_ids) - 1
    assert toks == _plain(disk_model, follow, depth)


def test_a_reloaded_model_resumes_from_disk(disk_model, tiny_dir):
    p = long_prompt(seed=7)
    ref = run(disk_model, p, depth=2, max_tokens=16).token_ids
    carryover_of(disk_model).disk_cache.flush()
    other = engine.load(tiny_dir)
    carryover_of(other).disk_cache = _disk(other, carryover_of(disk_model).disk_cache.root)
    reused, toks = _resumed(other, p, 2, max_tokens=16)
    assert reused == len(p) and toks == ref


def test_mtp_invariant_holds_after_a_disk_resume(disk_model):
    p = long_prompt(seed=3)
    out = run(disk_model, p, depth=3, max_tokens=20)
    carryover_of(disk_model).disk_cache.flush()
    follow = p + out.token_ids[:-1]
    snap = carryover_of(disk_model).disk_cache.load(follow + [5], need_mtp=True)
    assert snap is not None and len(snap.fed) > len(p)
    assert _mtp_invariant_holds(snap)
    live = Session.from_snapshot(disk_model, snap, use_mtp=True)
    x_next = 5
    fresh_logits, fresh_draft = _fresh_logits_and_mtp(disk_model, live.fed, x_next)
    np.testing.assert_allclose(np.array(live.last_logits), np.array(fresh_logits), atol=1e-4)
    assert draft_one(live, x_next).tolist() == fresh_draft.tolist()


def test_short_prompts_are_not_saved(disk_model):
    run(disk_model, long_prompt(20), depth=1, max_tokens=5)
    carryover_of(disk_model).disk_cache.flush()
    assert not list(carryover_of(disk_model).disk_cache.root.glob("*/*.json"))


def _entries(disk):
    return sorted(disk.dir.glob("*.json"), key=lambda m: m.stat().st_mtime_ns)


def test_lru_keeps_the_total_under_the_bound(disk_model):
    disk = carryover_of(disk_model).disk_cache
    run(disk_model, long_prompt(seed=1), depth=0, max_tokens=2)
    disk.flush()
    one = sum(f.stat().st_size for f in disk.dir.iterdir())  # two entries: prompt + end
    disk.max_bytes = int(one * 1.6)    # room for three entries, not four
    for seed in (2, 3):
        run(disk_model, long_prompt(seed=seed), depth=0, max_tokens=2)
        disk.flush()
    sizes = sum(f.stat().st_size for f in disk.dir.iterdir())
    assert sizes <= disk.max_bytes and len(_entries(disk)) == 3
    assert disk.load(long_prompt(seed=1)) is None          # the oldest went first
    assert disk.load(long_prompt(seed=3)) is not None


def test_a_hit_makes_an_entry_recent(disk_model):
    disk = carryover_of(disk_model).disk_cache
    for seed in (1, 2):
        run(disk_model, long_prompt(seed=seed), depth=0, max_tokens=1)
        disk.flush()
    before = _entries(disk)
    for i, man in enumerate(before):  # distinct, old times in save order (seed 2's are newest)
        os.utime(man, ns=(10**18 + i * 10**9,) * 2)
    assert disk.load(long_prompt(seed=1)) is not None
    newest = _entries(disk)[-1]
    assert newest != before[-1] and newest.stat().st_mtime_ns > 10**18 + len(before) * 10**9


def test_corrupt_files_are_removed_and_generation_goes_on(disk_model):
    p = long_prompt(seed=4)
    ref = run(disk_model, p, depth=2, max_tokens=12).token_ids
    disk = carryover_of(disk_model).disk_cache
    disk.flush()
    for man in _entries(disk):
        arr = man.with_suffix(".safetensors")
        arr.write_bytes(arr.read_bytes()[: arr.stat().st_size // 2])
    reused, toks = _resumed(disk_model, p, 2, max_tokens=12)
    assert reused == 0 and toks == ref
    disk.flush()
    (disk.dir / "junk.json").write_text("{not json")
    assert disk.load(p) is not None            # the reply above saved it again
    assert not (disk.dir / "junk.json").exists()


def test_foreign_entries_are_ignored(disk_model, tmp_path):
    p = long_prompt(seed=5)
    run(disk_model, p, depth=1, max_tokens=4)
    disk = carryover_of(disk_model).disk_cache
    disk.flush()
    for man in _entries(disk):                  # a manifest of another model, same folder
        meta = json.loads(man.read_text())
        man.write_text(json.dumps(dict(meta, model_key="0" * 32)))
    assert disk.load(p) is None and not _entries(disk)
    run(disk_model, p, depth=1, max_tokens=4)
    disk.flush()
    before = len(_entries(disk))
    other = diskcache.DiskPromptCache(disk.root, disk.key, {"trunk": [["kv"]], "mtp": []},
                                      max_bytes=1 << 30, min_tokens=1)
    assert other.load(p) is None                # the layout does not fit: removed
    assert len(_entries(disk)) == before - 1   # (the reply's end state is not a prefix of p)


def test_another_model_has_its_own_key(tiny_dir, tmp_path):
    from tests.tinymodels import build_tiny_model

    a = diskcache.model_key(str(tiny_dir), "float32", [])
    b = diskcache.model_key(str(build_tiny_model(tmp_path / "b", seed=4)), "float32", [])
    assert a != b and a != diskcache.model_key(str(tiny_dir), "bfloat16", [])


def test_the_off_switch_and_size_setting(tiny_model, monkeypatch, tmp_path):
    cache = tiny_model.trunk.make_cache()
    monkeypatch.setenv("MTPCHAT_PROMPT_DISK_CACHE", "0")
    assert diskcache.from_env(tiny_model.info.path, "float32", cache, None, root=tmp_path) is None
    monkeypatch.setenv("MTPCHAT_PROMPT_DISK_CACHE", "1")
    monkeypatch.setenv("MTPCHAT_PROMPT_DISK_CACHE_MB", "3")
    monkeypatch.setenv("MTPCHAT_PROMPT_DISK_CACHE_MIN_TOKENS", "50")
    d = diskcache.from_env(tiny_model.info.path, "float32", cache, None, root=tmp_path)
    assert d.max_bytes == 3 * 2**20 and d.min_tokens == 50


@pytest.mark.parametrize("depth", [0, 2])
def test_demo_model_resume_from_disk_is_exact(tmp_path, depth):
    model = engine.load(engine.default_model_path())
    carryover_of(model).disk_cache = _disk(model, tmp_path, min_tokens=1024)
    text = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(200))
    p = model.chat_ids([{"role": "user", "content": text}])[:1100]
    first = run(model, p, depth=depth, max_tokens=24).token_ids
    carryover_of(model).disk_cache.flush()
    reused, toks = _resumed(model, p, depth)
    assert reused == len(p) and toks == first == _plain(model, p, depth)


def test_a_depth0_entry_does_not_stop_an_mtp_one(disk_model):
    """A depth-0 snapshot has no MTP cache: depth 2 cannot resume from it, so its own
    snapshot is saved too; after that both depths resume from the MTP one."""
    p = long_prompt(seed=9)
    run(disk_model, p, depth=0, max_tokens=2)
    carryover_of(disk_model).disk_cache.flush()
    assert _resumed(disk_model, p, 2, max_tokens=2)[0] == 0
    carryover_of(disk_model).disk_cache.flush()
    n = len(_entries(carryover_of(disk_model).disk_cache))
    assert _resumed(disk_model, p, 2, max_tokens=2)[0] == len(p)
    assert _resumed(disk_model, p, 0, max_tokens=2)[0] == len(p)
    carryover_of(disk_model).disk_cache.flush()
    assert len(_entries(carryover_of(disk_model).disk_cache)) == n
