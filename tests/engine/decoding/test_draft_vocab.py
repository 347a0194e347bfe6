"""Drafting over part of the vocabulary (``engine.decoding.draft_vocab``): the setting, the rows
it takes from the LM head (plain, untied, quantized), and that output stays exact — greedy
depths equal depth 0, and batched seeded streams equal each alone (its distribution:
``test_distribution.test_a_draft_vocabulary_keeps_the_plain_distribution``)."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import engine
from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.decoding import draft_vocab
from engine.decoding.decoder import BatchDecoder
from engine.decoding.window import (DRAFT_VOCAB, DRAFT_VOCAB_ENV, check_draft_settings,
                                    draft_vocab_setting)
from tests.engine.decoding.test_batching import alone, batched
from tests.engine.decoding.test_decode import prompts
from tests.tinymodels import build_tiny_model

SIZE = 48  # of the tiny models' 384 rows


def test_the_setting_reads_a_count_or_refuses_in_one_line(monkeypatch):
    monkeypatch.delenv(DRAFT_VOCAB_ENV, raising=False)
    assert draft_vocab_setting() is None
    for raw, want in (("0", 0), (" 4096 ", 4096)):
        monkeypatch.setenv(DRAFT_VOCAB_ENV, raw)
        assert draft_vocab_setting() == want
    for raw in ("many", "-1", "1.5"):
        monkeypatch.setenv(DRAFT_VOCAB_ENV, raw)
        with pytest.raises(ValueError) as err:
            check_draft_settings()
        assert DRAFT_VOCAB_ENV in str(err.value) and "\n" not in str(err.value)


def test_automatic_size_drafts_over_part_only_of_a_large_vocabulary():
    assert draft_vocab.wanted_size(4096, None) is None          # the demo: all of it
    assert draft_vocab.wanted_size(248_320, None) == DRAFT_VOCAB  # Qwen3.5
    assert draft_vocab.wanted_size(248_320, 0) is None
    # where the head is a small part of the model (Qwen3.5-27B: 4.7 %), all of it
    assert draft_vocab.wanted_size(248_320, None, share=0.047) is None
    assert draft_vocab.wanted_size(248_320, None, share=0.32) == DRAFT_VOCAB
    assert draft_vocab.wanted_size(248_320, 4096, share=0.047) == 4096  # asked for
    assert draft_vocab.wanted_size(384, SIZE) == SIZE
    assert draft_vocab.wanted_size(384, 384) is None
    assert draft_vocab.wanted_size(384, 1000) is None


def test_the_heads_share_is_of_the_bytes_a_step_reads_experts_at_top_k(tmp_path):
    from mlx.utils import tree_flatten

    from tests.tinyfamilies import build_tiny_family

    build_tiny_family(tmp_path / "moe", "qwen3_next")
    model = engine.load(str(tmp_path / "moe"))
    k = model.trunk.args.num_experts_per_tok
    dense = moe = 0
    for part in (model.trunk, model.mtp):
        for name, v in tree_flatten(part.parameters()):
            if ".switch_mlp." in name:
                moe += v.nbytes
            else:
                dense += v.nbytes
    head = model.head_rows().weight.nbytes
    assert moe > 0 and 0 < k < 8
    assert draft_vocab.head_share(model) == pytest.approx(head / (dense + moe * k / 8))
    assert draft_vocab.head_share(model) > head / (dense + moe)   # all experts: a smaller share
    demo = engine.load(engine.resources.default_model_path())
    weights = sum(v.nbytes for p in (demo.trunk, demo.mtp) for _, v in tree_flatten(p.parameters()))
    assert draft_vocab.head_share(demo) == pytest.approx(4096 * 192 * 4 / weights)  # tied, float32


def test_special_tokens_first_then_the_lowest_ids():
    assert draft_vocab.choose_ids(10, 4, [9, 2, 42]) == [0, 1, 2, 9]
    assert draft_vocab.choose_ids(10, 1, [9, 8]) == [8]  # smaller than the special tokens


def _whole_logits(model, h):
    return model.draft_logits(h)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_rows_are_the_heads_and_score_as_it_does(tmp_path, monkeypatch, tied):
    model = engine.load(build_tiny_model(tmp_path / "m", tied=tied, seed=5))
    monkeypatch.setenv(DRAFT_VOCAB_ENV, str(SIZE))
    sub = draft_vocab.for_model(model)
    assert sub is not None and sub.size == SIZE and sub.vocab == 384
    ids = np.array(sub.ids).tolist()
    assert ids == sorted(ids) and len(set(ids)) == SIZE
    assert set(model.info.eos_token_ids) <= set(ids)
    assert set(model.tokenizer.get_added_vocab().values()) <= set(ids)
    head = model.head_rows()
    assert np.array_equal(np.array(sub.weight), np.array(head["weight"])[ids])
    h = mx.random.normal((3, 1, model.info.hidden_size), key=mx.random.key(1))
    want = np.array(_whole_logits(model, h))[..., ids]
    np.testing.assert_allclose(np.array(sub.logits(model.draft_hidden(h))), want,
                               rtol=1e-5, atol=1e-5)
    assert draft_vocab.for_model(model) is sub  # built once per model and size
    monkeypatch.setenv(DRAFT_VOCAB_ENV, "0")
    assert draft_vocab.for_model(model) is None


def test_a_quantized_head_is_cut_by_rows():
    emb = nn.Embedding(256, 64)
    q = nn.QuantizedEmbedding.from_embedding(emb, group_size=32, bits=8)
    ids = mx.array([0, 3, 7, 100, 255], dtype=mx.int32)
    fields = draft_vocab.head_subset(q, ids)
    sub = draft_vocab.DraftVocab(ids=ids, vocab=256, **fields)
    h = mx.random.normal((2, 64), key=mx.random.key(2))
    want = np.array(q.as_linear(h))[:, [0, 3, 7, 100, 255]]
    np.testing.assert_allclose(np.array(sub.logits(h)), want, rtol=1e-5, atol=1e-5)
    assert draft_vocab.head_subset(nn.Linear(64, 10, bias=True), ids) is None


def test_a_dense_q_and_penalty_counts_move_between_the_set_and_the_vocabulary():
    sub = draft_vocab.DraftVocab(ids=mx.array([1, 4], dtype=mx.int32), vocab=6,
                                 weight=mx.zeros((2, 3)))
    assert np.array(sub.dense(mx.array([0.25, 0.75]))).tolist() == [0, 0.25, 0, 0, 0.75, 0]
    counts = mx.array([[5.0, 1.0, 0.0, 0.0, 2.0, 0.0]])
    assert np.array(sub.counts(counts)).tolist() == [[1.0, 2.0]]
    assert np.array(sub.to_vocab(mx.array([1, 0, 1]))).tolist() == [4, 1, 4]


def spread_set(monkeypatch, step: int = 7) -> None:
    """Make the set every ``step``-th id, so its positions are not its ids (a draft or a q
    left on positions would show), and let every row draft on it whatever its tokens."""
    monkeypatch.setattr(draft_vocab, "special_ids", lambda model: set(range(0, 10_000, step)))
    monkeypatch.setattr(draft_vocab, "MAX_MISSES", 1.0)


def test_a_row_whose_tokens_fall_outside_the_set_drafts_over_the_whole_vocabulary(
        tiny_model, monkeypatch):
    from engine.decoding import batch_caches

    monkeypatch.setenv(DRAFT_VOCAB_ENV, str(SIZE))
    monkeypatch.setattr(draft_vocab, "special_ids", lambda model: set(range(0, 10_000, 7)))
    sub = draft_vocab.for_model(tiny_model)
    assert sub.fits([7, 14, 21] * 10) and sub.fits([])
    assert sub.fits([7] * 9 + [1]) and not sub.fits([7] * 8 + [1, 2])  # 10 % at most
    whole = batch_caches.Batch.logits
    used = []

    def spy(self, h, s=None):
        used.append(s is not None)
        return whole(self, h, s)
    monkeypatch.setattr(batch_caches.Batch, "logits", spy)
    inside = [7 * i for i in range(1, 30)]
    for prompt, want in ((inside, True), ([1, 2, 3, 4, 5] * 6, False)):
        used.clear()
        alone(tiny_model, prompt, depth=2, max_tokens=1 + 2)  # one cycle, before any reply
        assert used and used[0] is want, prompt


def test_greedy_depths_equal_depth_0_on_a_draft_vocabulary(tiny_model, monkeypatch):
    monkeypatch.setenv(DRAFT_VOCAB_ENV, str(SIZE))
    spread_set(monkeypatch)
    assert BatchDecoder(tiny_model).batch.draft_vocab.size == SIZE
    for p in prompts(3, seed=61):
        base = alone(tiny_model, p, depth=0, max_tokens=24)
        for d in (1, 2, 3, 4):
            assert alone(tiny_model, p, depth=d, max_tokens=24) == base, d


@pytest.mark.parametrize("which", ["tiny", "demo"])
def test_batched_streams_on_a_draft_vocabulary_equal_each_alone(tiny_model, monkeypatch,
                                                                 which):
    """Greedy, sampled (grouped and per row), penalised and dense-q rows together. On the
    demo (a trained head: its drafts' q overlaps the target's, so a q on the wrong ids would
    be accepted differently) the set is every other id, half the vocabulary."""
    model = tiny_model if which == "tiny" else engine.load(engine.default_model_path())
    size, step = (SIZE, 7) if which == "tiny" else (2048, 2)
    monkeypatch.setenv(DRAFT_VOCAB_ENV, str(size))
    spread_set(monkeypatch, step)
    assert np.array(draft_vocab.for_model(model).ids).tolist()[:3] == [0, step, 2 * step]
    shared = SamplingParams(temperature=0.9, top_k=20, top_p=0.95)
    params = [SamplingParams(), shared, shared, SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.8, presence_penalty=0.4)]
    depths = [3, 2, 2, 3, 2]
    ps = prompts(len(params), seed=62)
    refs = [alone(model, p, depth=d, max_tokens=20, sampling=s, seed=300 + i)
            for i, (p, d, s) in enumerate(zip(ps, depths, params))]
    carryover_of(model).reset_prompt_cache()
    dec = BatchDecoder(model, max_streams=len(ps))
    streams = [dec.add(p, depth=d, max_tokens=20, sampling=s, seed=300 + i)
               for i, (p, d, s) in enumerate(zip(ps, depths, params))]
    got = batched(dec, streams)
    for s, ref in zip(streams, refs):
        assert got[s.id] == ref, s.row.params


def test_drafts_on_a_set_are_the_whole_heads_drafts_restricted_to_it(monkeypatch):
    """The demo's trained head, on a set without ids 0-63 (so positions and ids differ): its
    greedy drafts, hence every cycle's accepted count, equal those of the whole head with the
    logits outside the set at -inf. A draft left on its position in the set, or a q on the
    wrong ids, would be accepted differently."""
    from engine.decoding import batch_caches

    monkeypatch.setattr(draft_vocab, "MAX_MISSES", 1.0)
    model = engine.load(engine.default_model_path())
    head = model.head_rows()
    vocab = int(head["weight"].shape[0])
    ids = mx.array(list(range(64, vocab)), dtype=mx.int32)
    sub = draft_vocab.DraftVocab(ids=ids, vocab=vocab, **draft_vocab.head_subset(head, ids))
    outside = mx.full((vocab,), -mx.inf).at[ids].add(mx.inf)  # -inf off the set, nan on it
    outside = mx.where(mx.isnan(outside), 0.0, outside)
    whole = batch_caches.Batch.logits

    def run(on_set: bool):
        monkeypatch.setattr(draft_vocab, "for_model", lambda m, c=None: sub if on_set else None)
        monkeypatch.setattr(batch_caches.Batch, "logits", whole if on_set else
                            lambda self, h, s=None: whole(self, h) + outside)
        out = []
        for p in ("What does json.dumps do?", "Explain what a hash map is."):
            carryover_of(model).reset_prompt_cache()
            got, accepted = [], 0
            for ev in model.generate(model.chat_ids([{"role": "user", "content": p}]),
                                     max_tokens=40, depth=3):
                got.extend(ev.token_ids)
                accepted += ev.stats.accepted if ev.stats else 0
            out.append((got, accepted))
        return out

    on_set, masked = run(True), run(False)
    assert on_set == masked
    # the head really drafts (a third of a reply's tokens or more were accepted drafts; the
    # demo of 2026-12-06 answers the first question in 22 tokens, 10 of them accepted drafts)
    assert all(acc >= len(got) / 3 for got, acc in on_set), on_set


def test_a_bad_setting_stops_the_cli_in_one_line():
    import os
    import subprocess
    import sys

    env = dict(os.environ, **{DRAFT_VOCAB_ENV: "lots"})
    out = subprocess.run([sys.executable, "-m", "engine", "list"], env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and DRAFT_VOCAB_ENV in lines[0], out.stderr


def test_a_structured_row_drafts_over_the_whole_vocabulary_and_stays_exact(monkeypatch):
    """A grammar's mask is per vocabulary token, so a batch with a structured row drafts on
    the whole vocabulary; a free row alone drafts on the set. Each equals its decode alone."""
    from engine.decoding import batch_caches
    from engine.sampling.grammar import Constraint
    from tests.engine.decoding.test_batching import STRUCT, _demo_prompts

    model = engine.load(engine.default_model_path())
    monkeypatch.setenv(DRAFT_VOCAB_ENV, "2048")
    spread_set(monkeypatch, 2)
    whole = batch_caches.Batch.logits
    used = []

    def spy(self, h, s=None):
        used.append(s is not None)
        rows.append(h.shape[0])
        return whole(self, h, s)
    monkeypatch.setattr(batch_caches.Batch, "logits", spy)
    rows: list[int] = []

    def constraint():
        return Constraint.for_format(model.tokenizer, STRUCT, vocab_size=model.info.vocab_size,
                                     eos_ids=model.info.eos_token_ids)
    free, structured = _demo_prompts(model, 2)
    used.clear()
    ref_free = alone(model, free, depth=3, max_tokens=32)
    assert used and all(used)
    used.clear()
    ref_struct = alone(model, structured, depth=3, max_tokens=32, constraint=constraint())
    assert used and not any(used)
    carryover_of(model).reset_prompt_cache()
    dec = BatchDecoder(model, max_streams=2)
    streams = [dec.add(free, depth=3, max_tokens=32),
               dec.add(structured, depth=3, max_tokens=32, constraint=constraint())]
    used.clear()
    rows.clear()
    got = batched(dec, streams)
    assert got[streams[0].id] == ref_free and got[streams[1].id] == ref_struct
    together = [u for u, n in zip(used, rows) if n == 2]
    assert together and not any(together)  # the free row alone before the other joined: set


def test_counts_rank_tokens_and_move_on_when_they_double(monkeypatch):
    monkeypatch.setattr(draft_vocab, "LEARN_FROM", 6)
    c = draft_vocab.TokenCounts()
    c.add([5, 5, 5, 2, 2])
    assert c.ranked() == [5, 2] and c.version == 0 and c.unsaved == 5
    c.add([9])
    assert c.ranked() == [5, 2, 9] and c.version == 1  # 6 tokens
    c.add([9] * 5)
    assert c.version == 1                                # 11 < 2 x 6
    c.add([9])
    assert c.version == 2 and c.ranked() == [9, 5, 2]
    back = draft_vocab.TokenCounts.from_json({**c.to_json(), "x": 3, "4": "many", "-1": 2})
    assert back.counts == c.counts and back.total == c.total and back.version == 1
    monkeypatch.setattr(draft_vocab, "KEEP", 2)
    assert c.to_json() == {"9": 7, "5": 3}


def test_learnt_tokens_come_after_the_special_ones_and_before_the_lowest_ids():
    assert draft_vocab.choose_ids(20, 5, [19], ranked=[7, 3, 7, 30]) == [0, 1, 3, 7, 19]
    assert draft_vocab.choose_ids(20, 2, [19], ranked=[7, 3]) == [7, 19]


def test_a_set_learns_from_replies_and_keeps_what_it_learnt_with_the_weights(
        tmp_path, monkeypatch):
    from engine.core import carryover
    from engine.hub import store

    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(DRAFT_VOCAB_ENV, str(SIZE))
    monkeypatch.setattr(draft_vocab, "LEARN_FROM", 16)
    monkeypatch.setattr(draft_vocab, "MAX_MISSES", 1.0)
    monkeypatch.setattr(carryover, "SAVE_COUNTS_EVERY", 16)
    folder = build_tiny_model(tmp_path / "m", seed=8)
    model = engine.load(folder)
    carry = carryover.carryover_of(model)
    assert carry.token_counts is not None and carry.token_counts.total == 0
    first = draft_vocab.for_model(model, carry.token_counts)
    reply = alone(model, prompts(1, seed=64)[0], depth=2, max_tokens=40)
    counts = carry.token_counts
    assert counts.total == len(reply) and counts.version == 1 and counts.unsaved == 0
    assert store.read_token_counts(folder) == counts.to_json()
    learnt = draft_vocab.for_model(model, counts)
    assert learnt is not first
    top = [t for t in counts.ranked()[:SIZE // 2]]
    assert set(top) <= set(np.array(learnt.ids).tolist())
    # the next process starts from them; new weights (another signature) do not
    again = carryover.Carryover.for_model(model)
    assert again.token_counts.counts == counts.counts and again.token_counts.version == 1
    import os
    shard = next(folder.glob("*.safetensors"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    assert store.read_token_counts(folder) is None


def test_a_decoder_drafts_on_the_rebuilt_set_once_the_counts_move_on(tiny_model, monkeypatch):
    monkeypatch.setenv(DRAFT_VOCAB_ENV, str(SIZE))
    counts = draft_vocab.TokenCounts()
    dec = BatchDecoder(tiny_model)
    dec.batch.counts = counts
    before = dec.batch.current_draft_vocab()
    monkeypatch.setattr(draft_vocab, "LEARN_FROM", 4)
    counts.add([383, 383, 383, 382])
    after = dec.batch.current_draft_vocab()
    assert after is not before and {382, 383} <= set(np.array(after.ids).tolist())
    assert dec.batch.current_draft_vocab() is after  # no rebuild until the next version
