"""The MTP head's draft window (``RowKVCache.window``, ``batch_caches.draft_window``): a draft
step's query at position p attends to positions p - window + 1 .. p of its own row, whatever
the other rows' lengths; the keys no row sees are left out of the product; output stays exact
(greedy equals plain decoding) and each stream drafts the same alone as in a batch."""
from __future__ import annotations

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine.decoding import batch_caches
from engine.decoding.rowcache import RowKVCache
from engine.models import cpu_attention
from tests.engine.decoding.test_batching import alone, assert_exact_and_row_independent
from tests.engine.decoding.test_decode import prompts

H, D = 2, 8


def _cache(lengths, window, seed=0):
    rng = np.random.default_rng(seed)
    T = max(lengths) + 8
    k = mx.array(rng.standard_normal((len(lengths), H, T, D)).astype(np.float32))
    v = mx.array(rng.standard_normal((len(lengths), H, T, D)).astype(np.float32))
    return RowKVCache(k, v, list(lengths), window=window)


def _attend(cache, q, k_new, v_new):
    mask = cache.make_mask(q.shape[2])
    k, v = cache.update_and_fetch(k_new, v_new)
    return cpu_attention.attention(q, k, v, scale=D ** -0.5, mask=mask), k.shape[2]


@pytest.mark.parametrize("lengths,n", [([5, 12, 9], 3), ([20, 20], 1), ([30, 3], 1),
                                       ([17], 2), ([2, 4], 2)])
@pytest.mark.parametrize("window", [1, 4, 9])
def test_each_query_sees_exactly_its_own_window(lengths, n, window):
    """Against the whole-context cache with an explicit mask: query j of row b (position
    lengths[b] + j) sees max(0, p - window + 1) .. p and nothing else."""
    rng = np.random.default_rng(1)
    B = len(lengths)
    q = mx.array(rng.standard_normal((B, H, n, D)).astype(np.float32))
    kn = mx.array(rng.standard_normal((B, H, n, D)).astype(np.float32))
    vn = mx.array(rng.standard_normal((B, H, n, D)).astype(np.float32))
    got, returned = _attend(_cache(lengths, window), q, kn, vn)

    full = _cache(lengths, None)
    full.update_and_fetch(kn, vn)
    T = max(lengths) + n
    keep = np.zeros((B, 1, n, T), bool)
    for b, length in enumerate(lengths):
        for j in range(n):
            p = length + j
            keep[b, 0, j, max(0, p - window + 1):p + 1] = True
    k, v = full.keys[..., :T, :], full.values[..., :T, :]
    want = cpu_attention.attention(q, k, v, scale=D ** -0.5, mask=mx.array(keep))
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)
    # the product only reads from the earliest first position of any row's window
    assert returned == T - max(0, min(lengths) - window + 1)


def test_without_a_window_every_earlier_position_is_seen():
    c = _cache([6, 10], None)
    assert c.make_mask(1).shape == (2, 1, 1, 11)
    k, _ = c.update_and_fetch(mx.zeros((2, H, 1, D)), mx.zeros((2, H, 1, D)))
    assert k.shape[2] == 11
    with pytest.raises(ValueError, match="at least 1"):
        RowKVCache(window=0)


def test_the_window_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(batch_caches.WINDOW_ENV, raising=False)
    assert batch_caches.draft_window() == batch_caches.DRAFT_WINDOW
    monkeypatch.setenv(batch_caches.WINDOW_ENV, "0")
    assert batch_caches.draft_window() is None
    monkeypatch.setenv(batch_caches.WINDOW_ENV, " 512 ")
    assert batch_caches.draft_window() == 512
    for bad in ("-3", "lots"):
        monkeypatch.setenv(batch_caches.WINDOW_ENV, bad)
        with pytest.raises(ValueError, match=batch_caches.WINDOW_ENV):
            batch_caches.draft_window()


def test_a_small_window_keeps_output_exact_and_rows_independent(tiny_model, monkeypatch):
    """With a 6-position window (shorter than most prompts): greedy MTP output equals plain
    decoding; seeded sampled streams give the same tokens batched and alone (what a row drafts
    depends on its own window only); and the window is really in effect (the head's first
    draft state differs from the whole-context head's)."""
    ps = [p for p in prompts(10, seed=41) if len(p) > 12][:5]
    assert len(ps) >= 3
    monkeypatch.setenv(batch_caches.WINDOW_ENV, "6")
    assert_exact_and_row_independent(tiny_model, ps, seed=7)

    # the window is in effect: the head's draft states differ from the whole-context head's
    seen = []
    first = batch_caches.Batch.mtp_first

    def spy(self, *a, **k):
        out = first(self, *a, **k)
        seen.append(np.array(out))
        return out

    monkeypatch.setattr(batch_caches.Batch, "mtp_first", spy)
    states = {}
    for w in ("0", "6"):
        monkeypatch.setenv(batch_caches.WINDOW_ENV, w)
        seen.clear()
        alone(tiny_model, ps[0], depth=3, max_tokens=12)
        states[w] = seen[:]
    assert len(states["0"]) == len(states["6"]) > 1
    assert not np.allclose(states["0"][0], states["6"][0])
