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


@pytest.mark.parametrize("S", [1, 7, 300, 4099])
@pytest.mark.parametrize("spread", [1.0, 30.0])
def test_softmax_is_float64s_within_float32_rounding_at_any_length(S, spread):
    """The CPU softmax's own exponential (compiled once, shapeless, for every key count)
    against float64's: masked (-inf) scores give exactly 0, far-below-the-max ones below
    1e-30, every other probability within 2e-6 relative plus what rounding its float32
    argument costs; NaN stays NaN."""
    rng = np.random.default_rng(S)
    x = (rng.standard_normal((2, 3, S)) * spread).astype(np.float32)
    if S > 2:
        x[0, 0, :S // 2] = -np.inf     # masked keys
        x[1, 2, 1] = x[1, 2].max() - 200.0
    got = np.array(cpu_attention.softmax(mx.array(x))).astype(np.float64)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    assert np.all(got[np.isneginf(x)] == 0.0)
    big = want > 1e-30
    # a float32 argument is rounded by 2^-24 of itself: e^x then by |x| 2^-24 relative
    gap = np.abs(x64 - x64.max(axis=-1, keepdims=True))
    assert np.all(np.abs(got - want)[big] / want[big] < 2e-6 + gap[big] * 2.0 ** -23)
    assert np.all(got[~big] < 1e-30)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)  # a float32 sum of S
    nan = np.array(cpu_attention.softmax(mx.array([[0.0, np.nan, 1.0]])))
    assert np.isnan(nan).all()


def test_softmax_keeps_a_half_precision_dtype():
    x = mx.random.normal((2, 5)).astype(mx.bfloat16)
    out = cpu_attention.softmax(x)
    assert out.dtype == mx.bfloat16
    np.testing.assert_allclose(np.array(out.astype(mx.float32)),
                               np.array(mx.softmax(x.astype(mx.float32), axis=-1)), atol=4e-3)


@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (4, 2), (8, 2)])
@pytest.mark.parametrize("L,S", [(5, 5), (16, 300), (300, 300), (130, 700)])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_host_attention_equals_the_fast_path(Hq, Hkv, L, S, mask):
    """A prefill chunk's attention on the host: several blocks of queries (130 and 300 rows
    cross ``HOST_TILE``), a chunk that is the whole context or its end."""
    q, k, v = _qkv(2, Hq, Hkv, L, S, 16, seed=L + S)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    _close(cpu_attention.host_attention(q, k, v, scale=0.25, mask=mask), ref)


def test_host_attention_array_masks_and_dtype():
    q, k, v = _qkv(2, 4, 2, 140, 200, 8, seed=3)
    keep = np.tril(np.ones((140, 200), dtype=bool), 60)[None, None].repeat(2, 0)
    keep[0, :, :, :5] = False          # a left-padded row
    for mask in (mx.array(keep), mx.where(mx.array(keep), 0.0, -1e9),
                 mx.array(np.broadcast_to(keep, (2, 4, 140, 200)).copy())):
        ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=mask)
        _close(cpu_attention.host_attention(q, k, v, scale=0.3, mask=mask), ref)
    half = [x.astype(mx.bfloat16) for x in (q, k, v)]
    got = cpu_attention.host_attention(*half, scale=0.3, mask="causal")
    ref = mx.fast.scaled_dot_product_attention(*[x.astype(mx.float32) for x in half],
                                               scale=0.3, mask="causal")
    assert got.dtype == mx.bfloat16
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(ref), atol=2e-2)
    with pytest.raises(ValueError, match="mask"):
        cpu_attention.host_attention(q, k, v, scale=0.3, mask="sliding")


def test_only_prefill_chunks_take_the_host():
    assert not cpu_attention.host_applies(1, 1 << 22)      # a decode step
    assert not cpu_attention.host_applies(7, 1 << 22)      # a verify at depth 6
    assert not cpu_attention.host_applies(512, 1024)        # a short prompt's chunk
    assert cpu_attention.host_applies(512, 2048)
