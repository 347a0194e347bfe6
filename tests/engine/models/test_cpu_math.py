"""The prefill's fused sigmoid/SiLU and the chunked recurrence's exponential
(``engine.models.cpu_math``, ``gdn_chunked.exp_nonpositive``): within a float32 rounding or
two of MLX's own on every range, the same at the edges (0, +-88, +-inf, NaN), and MLX's own
below ``LARGE`` elements or off float32."""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from engine.models import cpu_math
from engine.models.gdn_chunked import exp_nonpositive

EDGES = [0.0, -0.0, 1e-9, -1e-9, 88.0, -88.0, 88.5, -88.5, 100.0, -100.0, float("inf"),
         -float("inf")]


def _x(n: int = cpu_math.LARGE) -> mx.array:
    mx.random.seed(0)
    x = mx.random.normal((n,)) * 8
    return mx.concatenate([mx.array(EDGES, dtype=mx.float32), x])


def test_sigmoid_and_silu_match_mlx_within_a_rounding():
    x = _x()
    ref64 = 1.0 / (1.0 + np.exp(-np.array(x, dtype=np.float64)))
    got, mlx = np.array(cpu_math.sigmoid(x)), np.array(mx.sigmoid(x))
    assert np.abs(got - mlx).max() <= 2.4e-7
    assert np.abs(got - ref64).max() <= 2.4e-7  # as close to the truth as MLX's (8e-8 here)
    assert np.array_equal(got[:len(EDGES)], mlx[:len(EDGES)])
    silu, mlx_silu = np.array(cpu_math.silu(x)), np.array(x * mx.sigmoid(x))
    fin = np.isfinite(mlx_silu)
    assert np.allclose(silu[fin], mlx_silu[fin], rtol=5e-7, atol=1e-30)
    assert np.array_equal(np.isnan(silu), np.isnan(mlx_silu))
    assert np.array_equal(silu[~fin & ~np.isnan(mlx_silu)], mlx_silu[~fin & ~np.isnan(mlx_silu)])


def test_small_or_other_dtypes_are_mlx_exactly():
    x = _x(100)
    assert not cpu_math.large(x)
    assert np.array_equal(np.array(cpu_math.sigmoid(x)), np.array(mx.sigmoid(x)))
    b = _x().astype(mx.bfloat16)
    assert np.array_equal(np.array(cpu_math.silu(b).astype(mx.float32)),
                          np.array((b * mx.sigmoid(b)).astype(mx.float32)), equal_nan=True)


def test_exp_of_nonpositive_matches_mlx():
    x = -mx.abs(_x())
    got, ref = np.array(exp_nonpositive(x)), np.array(mx.exp(x))
    assert np.allclose(got, ref, rtol=5e-7, atol=1e-37)
    assert exp_nonpositive(mx.array([-mx.inf])).item() == 0.0
    assert exp_nonpositive(mx.array([0.0])).item() == 1.0
