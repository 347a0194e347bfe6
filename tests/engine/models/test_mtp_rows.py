"""An MTP step 1 wants one position's output per row (``MTPHead(..., at=...)``): the head
then runs its attention and MLP for that position alone; every pair still enters its cache.
Same outputs and caches as the whole forward, on both device branches, one row or a batch
of right-padded rows."""
from __future__ import annotations

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine.decoding.rowcache import RowKVCache
from engine.models import device


def _caches(model, kind: str, lengths: list[int]):
    head = model.mtp
    (hk, dk), (hv, dv) = head.kv_shapes()
    caches = []
    for _ in range(2):  # one for the whole forward, one for ``at``
        if kind == "row":
            B, T = len(lengths), max(lengths)
            keys = mx.random.normal((B, hk, T, dk), key=mx.random.key(1))
            vals = mx.random.normal((B, hv, T, dv), key=mx.random.key(2))
            caches.append([RowKVCache(keys, vals, lengths)])
        else:
            c = head.make_cache()
            c[0].update_and_fetch(mx.random.normal((1, hk, lengths[0], dk), key=mx.random.key(1)),
                                  mx.random.normal((1, hv, lengths[0], dv), key=mx.random.key(2)))
            caches.append(c)
    return caches


@pytest.mark.parametrize("branch", device.BRANCHES)
@pytest.mark.parametrize("kind,lengths,widths", [("single", [9], [4]), ("single", [9], [1]),
                                                 ("row", [7, 12, 9], [3, 1, 4])])
def test_one_position_per_row_equals_the_whole_forward(tiny_model, branch, kind, lengths, widths):
    head, H = tiny_model.mtp, tiny_model.text_model.args.hidden_size
    B, W = len(widths), max(widths)
    hidden = mx.random.normal((B, W, H), key=mx.random.key(3))
    embeds = mx.random.normal((B, W, H), key=mx.random.key(4))
    at = mx.array([w - 1 for w in widths], dtype=mx.int32)
    whole_cache, at_cache = _caches(tiny_model, kind, lengths)
    with device.use_branch(branch):
        whole = head(hidden, embeds, whole_cache)
        want = mx.take_along_axis(whole, at[:, None, None], axis=1)
        got = head(hidden, embeds, at_cache, at=at)
    assert got.shape == (B, 1, H)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    for a, b in zip(whole_cache[0].state, at_cache[0].state):
        assert np.array_equal(np.array(a), np.array(b))  # every pair's keys and values
