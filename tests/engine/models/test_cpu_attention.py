"""The CPU branch's folded attention (engine/models/cpu_attention.py) against MLX's fast
scaled dot-product attention: the same outputs for every mask form the forwards pass."""
from __future__ import annotations

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine.models import cpu_attention


def _qkv(B, Hq, Hkv, L, S, D, seed=0):
    keys = mx.random.split(mx.random.key(seed), 3)
    return (mx.random.normal((B, Hq, L, D), key=keys[0]),
            mx.random.normal((B, Hkv, S, D), key=keys[1]),
            mx.random.normal((B, Hkv, S, D), key=keys[2]))


def _close(a, b):
    np.testing.assert_allclose(np.array(a), np.array(b), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (4, 2), (8, 2)])
@pytest.mark.parametrize("L", [1, 4])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_folded_attention_equals_the_fast_path(Hq, Hkv, L, mask):
    q, k, v = _qkv(2, Hq, Hkv, L, 37, 16)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    _close(cpu_attention.attention(q, k, v, scale=0.25, mask=mask), ref)


def test_array_masks_bool_additive_and_per_head():
    q, k, v = _qkv(2, 4, 2, 3, 20, 8, seed=1)
    keep = np.ones((2, 1, 3, 20), dtype=bool)
    keep[0, :, :, :5] = False          # a left-padded row
    keep[1, :, 1:, 18:] = False
    for mask in (mx.array(keep), mx.where(mx.array(keep), 0.0, -1e9),
                 mx.array(np.broadcast_to(keep, (2, 4, 3, 20)).copy())):
        ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=mask)
        _close(cpu_attention.attention(q, k, v, scale=0.3, mask=mask), ref)
    with pytest.raises(ValueError, match="mask"):
        cpu_attention.attention(q, k, v, scale=0.3, mask="sliding")


def test_one_query_row_matches_the_fast_path_on_the_cpu_to_rounding():
    if mx.default_device() != mx.cpu:
        pytest.skip("the fast path is a Metal kernel here")
    q, k, v = _qkv(1, 4, 2, 1, 500, 64, seed=2)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=None)
    got = cpu_attention.attention(q, k, v, scale=0.125, mask=None)
    assert float(mx.abs(got - ref).max()) <= 1e-6
