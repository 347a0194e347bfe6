"""A batch's attention caches in whole blocks of keys (``RowKVCache(buckets=True)``, the CPU
branch): the attention sees the same keys with the same weights as with exact-length keys,
each step's key count stays the same for a block of ``STEP`` steps (so its temporaries keep
one size and glibc reuses their memory), and decoding stays exact."""
from __future__ import annotations

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.decoding import rowcache
from engine.decoding.decoder import BatchDecoder
from engine.decoding.rowcache import STEP, RowKVCache
from engine.models import cpu_attention
from tests.engine.decoding.test_batching import assert_exact_and_row_independent, batched
from tests.engine.decoding.test_decode import prompts

H, D = 2, 8


def _pair(lengths, window, seed=0):
    rng = np.random.default_rng(seed)
    T = max(lengths) + 8
    k = rng.standard_normal((len(lengths), H, T, D)).astype(np.float32)
    v = rng.standard_normal((len(lengths), H, T, D)).astype(np.float32)
    return [RowKVCache(mx.array(k), mx.array(v), list(lengths), window=window, buckets=b)
            for b in (False, True)]


@pytest.mark.parametrize("lengths,n", [([5, 12, 9], 3), ([20, 20], 1), ([300, 3], 1),
                                       ([255], 1), ([256], 1), ([511, 700], 4), ([17], 2)])
@pytest.mark.parametrize("window", [None, 4, 260])
def test_blocks_attend_exactly_like_exact_keys(lengths, n, window, monkeypatch):
    """Each query's output with the keys in blocks equals the exact-length one (to a float32
    rounding: the sums run over more, zero-weight, terms), over several steps; the keys
    returned start at a multiple of STEP and end where the last key's block ends."""
    monkeypatch.setattr(rowcache, "BLOCKS_FROM", 0)
    exact, blocked = _pair(lengths, window)
    rng = np.random.default_rng(1)
    B = len(lengths)
    for step in range(3):
        q = mx.array(rng.standard_normal((B, H, n, D)).astype(np.float32))
        kn = mx.array(rng.standard_normal((B, H, n, D)).astype(np.float32))
        vn = mx.array(rng.standard_normal((B, H, n, D)).astype(np.float32))
        outs = []
        for c in (exact, blocked):
            mask = c.make_mask(n)
            k, v = c.update_and_fetch(kn, vn)
            if mask is not None:
                assert mask.shape[-1] == k.shape[2]
            outs.append(cpu_attention.attention(q, k, v, scale=D ** -0.5, mask=mask))
            if c is blocked:
                end = max(c.lengths)
                first = 0 if window is None else max(0, min(c.lengths) - n - window + 1)
                assert k.shape[2] == -(-end // STEP) * STEP - (first - first % STEP)
        np.testing.assert_allclose(np.array(outs[1]), np.array(outs[0]), rtol=2e-6, atol=2e-7)
    assert blocked.lengths == exact.lengths


def test_a_decode_keeps_one_key_count_for_a_block(tiny_model, monkeypatch):
    """A reply decoded after a prompt of 300 tokens: every attention call of one kind sees
    the same number of keys until the reply crosses a block boundary (without blocks it
    grows by one every step)."""
    monkeypatch.setenv(rowcache.BUCKETS_ENV, "1")
    monkeypatch.setattr(rowcache, "BLOCKS_FROM", 256)
    counts = []
    real = cpu_attention.attention

    def spy(q, k, v, **kw):
        if q.shape[2] == 1:
            counts.append(k.shape[2])
        return real(q, k, v, **kw)

    monkeypatch.setattr(cpu_attention, "attention", spy)
    prompt = (prompts(1, seed=3)[0] * 40)[:300]
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=2)
    st = dec.add(prompt, depth=0, max_tokens=24, sampling=SamplingParams())
    tokens = batched(dec, [st])[st.id]
    assert len(tokens) == 24
    assert counts and set(counts) == {512}  # 300 .. 324 keys: the block 256 .. 511

    monkeypatch.setenv(rowcache.BUCKETS_ENV, "0")
    counts.clear()
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=2)
    st = dec.add(prompt, depth=0, max_tokens=24, sampling=SamplingParams())
    assert batched(dec, [st])[st.id] == tokens
    assert len(set(counts)) > 20


def test_exact_with_blocks(tiny_model, monkeypatch):
    """With blocks: greedy MTP output equals plain decoding, and seeded sampled streams give
    the same tokens batched and alone."""
    monkeypatch.setenv(rowcache.BUCKETS_ENV, "1")
    monkeypatch.setattr(rowcache, "BLOCKS_FROM", 0)
    ps = [p for p in prompts(10, seed=43) if len(p) > 8][:4]
    assert_exact_and_row_independent(tiny_model, ps, seed=11)


def test_blocks_start_at_blocks_from():
    """Below ``BLOCKS_FROM`` positions the keys are the exact ones (and a lone decode step
    needs no mask); from it on, whole blocks."""
    n0 = rowcache.BLOCKS_FROM - 10
    z = mx.zeros((1, H, 1, D))
    c = RowKVCache(mx.zeros((1, H, n0, D)), mx.zeros((1, H, n0, D)), [n0], buckets=True)
    assert c.make_mask(1) is None
    assert c.update_and_fetch(z, z)[0].shape[2] == n0 + 1
    c.lengths = [rowcache.BLOCKS_FROM + 5]
    assert c.make_mask(1).shape[-1] == rowcache.BLOCKS_FROM + STEP
    assert c.update_and_fetch(z, z)[0].shape[2] == rowcache.BLOCKS_FROM + STEP


def test_the_switch(monkeypatch):
    from engine.models import device

    for raw, want in (("1", True), ("on", True), ("0", False), ("no", False)):
        monkeypatch.setenv(rowcache.BUCKETS_ENV, raw)
        assert rowcache.key_buckets() is want
    monkeypatch.delenv(rowcache.BUCKETS_ENV)
    assert rowcache.key_buckets() is device.is_cpu()
