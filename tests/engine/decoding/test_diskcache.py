"""The prompt cache on disk: exact resumes (depth 0 and 2, after a reload), the MTP invariant
after a resume, the LRU size bound, corrupt and foreign files ignored, the off switch; the
writer that waits while a decode runs (queued snapshots serve loads, the queue's bound, flush
and the flush at exit), the safetensors writer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.core.carryover import carryover_of
from engine.decoding import diskcache
from engine.decoding.session import Session
from tests.engine.decoding.test_decode import (
    _fresh_logits_and_mtp, _mtp_invariant_holds, draft_one, run,
)


def _disk(model, root, *, min_tokens=64, max_bytes=1 << 30, **kw):
    kinds = {"trunk": diskcache.cache_kinds(model.trunk.make_cache()),
             "mtp": diskcache.cache_kinds(model.mtp.make_cache() if model.mtp else None)}
    key = diskcache.model_key(model.info.path, model.info.dtype, [kinds["trunk"], kinds["mtp"]])
    return diskcache.DiskPromptCache(root, key, kinds, max_bytes=max_bytes, min_tokens=min_tokens,
                                     **kw)


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


# -- the writer waits while a decode runs ------------------------------------------------------
def _busy_for(disk, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        disk.note_busy()
        time.sleep(0.02)
    disk.note_busy(False)


def test_the_writer_waits_while_a_decode_runs(tiny_model, tmp_path, monkeypatch):
    disk = _disk(tiny_model, tmp_path / "pc", idle_s=0.3)
    monkeypatch.setattr(carryover_of(tiny_model), "disk_cache", disk)
    carryover_of(tiny_model).reset_prompt_cache()
    disk.note_busy()
    run(tiny_model, long_prompt(seed=11), depth=2, max_tokens=8)
    _busy_for(disk, 1.0)                    # decoding goes on: nothing is written
    assert not list(disk.dir.glob("*.json")) if disk.dir.is_dir() else True
    assert disk._pending
    end = time.monotonic() + 20             # idle: the queue is written
    while (disk._pending or disk._writing) and time.monotonic() < end:
        time.sleep(0.05)
    assert len(list(disk.dir.glob("*.json"))) == 2   # after the prompt, at the end
    assert not list(disk.dir.glob(".*"))            # no temp file left


def test_the_decoder_marks_the_disk_cache_busy(tiny_model, tmp_path, monkeypatch):
    disk = _disk(tiny_model, tmp_path / "pc")
    monkeypatch.setattr(carryover_of(tiny_model), "disk_cache", disk)
    before = time.monotonic()
    seen = []
    for _ in tiny_model.generate(long_prompt(seed=12), max_tokens=4, depth=1):
        seen.append(disk._busy)
    assert disk._last_busy >= before
    assert all(seen[:-1]) and not disk._busy   # busy while it decodes, idle at its last event


@pytest.mark.parametrize("depth", [0, 2])
def test_a_queued_snapshot_resumes_exactly(tiny_model, tmp_path, monkeypatch, depth):
    disk = _disk(tiny_model, tmp_path / "pc", idle_s=3600)   # never idle long enough
    monkeypatch.setattr(carryover_of(tiny_model), "disk_cache", disk)
    carryover_of(tiny_model).reset_prompt_cache()
    disk.note_busy()
    p = long_prompt(seed=20 + depth)
    first = run(tiny_model, p, depth=depth, max_tokens=16)
    assert not disk.dir.exists() or not list(disk.dir.glob("*.json"))
    reused, toks = _resumed(tiny_model, p, depth, max_tokens=16)
    assert reused == len(p)
    assert toks == first.token_ids == _plain(tiny_model, p, depth, max_tokens=16)


def test_flush_writes_while_busy_and_the_entry_reads_back(tiny_model, tmp_path, monkeypatch):
    disk = _disk(tiny_model, tmp_path / "pc", idle_s=3600)
    monkeypatch.setattr(carryover_of(tiny_model), "disk_cache", disk)
    carryover_of(tiny_model).reset_prompt_cache()
    disk.note_busy()
    p = long_prompt(seed=30)
    ref = run(tiny_model, p, depth=2, max_tokens=12).token_ids
    disk.note_busy()
    assert disk.flush(timeout=30)
    assert not disk._pending and len(list(disk.dir.glob("*.json"))) == 2
    other = _disk(tiny_model, tmp_path / "pc")              # another process, reading the files
    monkeypatch.setattr(carryover_of(tiny_model), "disk_cache", other)
    reused, toks = _resumed(tiny_model, p, 2, max_tokens=12)
    assert reused == len(p) and toks == ref


def test_past_its_bound_the_queue_is_written_while_busy(tiny_model, tmp_path, monkeypatch):
    disk = _disk(tiny_model, tmp_path / "pc", idle_s=3600, max_pending_bytes=1)
    monkeypatch.setattr(carryover_of(tiny_model), "disk_cache", disk)
    carryover_of(tiny_model).reset_prompt_cache()
    for seed in (40, 41):
        run(tiny_model, long_prompt(seed=seed), depth=0, max_tokens=2)
    disk.note_busy(True)
    end = time.monotonic() + 20
    while (disk._pending or disk._writing) and time.monotonic() < end:
        disk.note_busy(True)
        time.sleep(0.05)
    assert disk._busy and len(list(disk.dir.glob("*.json"))) == 4


def test_a_queued_snapshot_is_written_at_exit(tiny_dir, tmp_path):
    root = tmp_path / "pc"
    code = f"""
import engine, numpy as np
from engine.core.carryover import carryover_of
from tests.engine.decoding.test_diskcache import _disk
m = engine.load({str(tiny_dir)!r})
disk = _disk(m, {str(root)!r}, idle_s=3600)
carryover_of(m).disk_cache = disk
disk.note_busy()
p = np.random.default_rng(0).integers(3, 380, size=200).tolist()
list(m.generate(p, max_tokens=4, depth=1))
assert disk._pending, "the snapshots should still be queued"
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(root.glob("*/*.json"))) == 2


def test_the_safetensors_writer_is_what_mlx_reads(tmp_path):
    import mlx.core as mx

    arrays = {"f32": mx.arange(12, dtype=mx.float32).reshape(3, 4) / 7,
              "bf16": (mx.arange(10, dtype=mx.float32) / 3).astype(mx.bfloat16),
              "f16": mx.array([1.5, -2.25], dtype=mx.float16),
              "i32": mx.array([[1, -2], [3, 4]], dtype=mx.int32),
              "bool": mx.array([True, False, True]),
              "empty": mx.zeros((0, 3), dtype=mx.float32),
              "scalar": mx.array(3.0)}
    host = {k: diskcache._host_copy(v) for k, v in arrays.items()}
    pauses = []
    monkey_chunk = diskcache.CHUNK_BYTES
    diskcache.CHUNK_BYTES = 16            # many pieces, a pause between each
    try:
        diskcache.write_safetensors(tmp_path / "x.safetensors", host,
                                    pause=lambda: pauses.append(1))
    finally:
        diskcache.CHUNK_BYTES = monkey_chunk
    back = mx.load(str(tmp_path / "x.safetensors"))
    assert set(back) == set(arrays) and len(pauses) > len(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert mx.array_equal(back[k], v).item(), k


def test_a_conversations_next_reply_replaces_its_queued_states(tiny_model, tmp_path,
                                                                monkeypatch):
    disk = _disk(tiny_model, tmp_path / "pc", idle_s=3600)
    monkeypatch.setattr(carryover_of(tiny_model), "disk_cache", disk)
    carryover_of(tiny_model).reset_prompt_cache()
    disk.note_busy()
    other = long_prompt(seed=51)
    run(tiny_model, other, depth=0, max_tokens=2)          # another conversation, first
    p = long_prompt(seed=50)
    first = run(tiny_model, p, depth=2, max_tokens=6)
    follow = p + first.token_ids + [11, 12, 13]
    second = run(tiny_model, follow, depth=2, max_tokens=6, fresh=False)  # the same lineage
    assert disk.superseded == 2
    lengths = sorted(j.n for j in disk._pending.values())
    assert lengths == sorted([len(other), len(other) + 1, len(follow),
                              len(follow) + len(second.token_ids) - 1])
    assert disk.flush(timeout=30) and len(list(disk.dir.glob("*.json"))) == 4


def test_a_session_resumed_from_disk_starts_its_own_lineage(disk_model):
    p = long_prompt(seed=52)
    run(disk_model, p, depth=0, max_tokens=2)
    disk = carryover_of(disk_model).disk_cache
    disk.flush()
    snap = disk.load(p)
    assert snap is not None and snap.lineage == 0
    assert Session.from_snapshot(disk_model, snap, use_mtp=False).lineage != 0
