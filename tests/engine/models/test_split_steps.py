"""The verify forward's pieces that replace MLX's own with fewer graph nodes, bit for bit:
the GDN recurrence on split inputs (engine/models/trunk.py ``_split_steps``) is mlx-lm's one
step (``_gated_delta_step_ops``) S times, and one RoPE table for queries and keys
(``trunk.rotated``) is ``mx.fast.rope`` on each."""
from __future__ import annotations

import io
import re

import mlx.core as mx
import numpy as np
import pytest

from engine.models import trunk


def _stepped(q, k, v, g, beta, state):
    outs, states = [], []
    for j in range(q.shape[1]):
        y, state = trunk._step_ops(q[:, j], k[:, j], v[:, j], g[:, j], beta[:, j], state, None)
        outs.append(y[:, None])
        states.append(state)
    return [mx.concatenate(outs, axis=1)] + states


def _split(*args):
    out, states = trunk._split_steps(*args)
    return [out] + states


@pytest.mark.parametrize("heads,dim", [(8, 32), (16, 128)])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("steps", [1, 2, 4])
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_split_steps_are_mlx_lms_steps_bit_for_bit(heads, dim, rows, steps, compiled, dtype):
    rng = np.random.default_rng(heads * 100 + rows * 10 + steps)

    def arr(*shape, dtype=mx.float32):
        return mx.array(rng.normal(size=shape).astype(np.float32)).astype(dtype)
    q, k, v = (arr(rows, steps, heads, dim, dtype=dtype) for _ in range(3))
    g = mx.sigmoid(arr(rows, steps, heads))  # compute_g's gates are float32, beta the model's
    beta = mx.sigmoid(arr(rows, steps, heads, dtype=dtype))
    state = arr(rows, heads, dim, dim)  # the recurrent state is float32
    ref, got = _stepped, _split
    if compiled:  # as the verify and the plain step run it: inside a compiled layer
        ref, got = mx.compile(ref), mx.compile(got)
    want, have = ref(q, k, v, g, beta, state), got(q, k, v, g, beta, state)
    assert len(want) == len(have) == 1 + steps
    for a, b in zip(want, have):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)))


def _nodes(*outs) -> int:
    """Graph nodes (primitives not yet evaluated) behind ``outs``."""
    f = io.StringIO()
    mx.export_to_dot(f, *outs)
    return len(re.findall(r'shape=rectangle', f.getvalue()))


def test_a_verify_step_is_three_graph_nodes():
    """Each node costs the CPU a few microseconds whatever it computes: a step is one fused
    product, its sum and one fused update (mlx-lm's step op is nine with its output's)."""
    counts = {}
    for steps in (2, 4):
        q, k, v = (mx.random.normal((1, steps, 8, 32)) for _ in range(3))
        g, beta = (mx.sigmoid(mx.random.normal((1, steps, 8))) for _ in range(2))
        state = mx.random.normal((1, 8, 32, 32))
        mx.eval(q, k, v, g, beta, state)
        out, states = mx.compile(trunk._split_steps)(q, k, v, g, beta, state)
        counts[steps] = _nodes(out, states[-1])
    assert counts[4] - counts[2] == 2 * 3
    assert counts[4] <= 30


@pytest.mark.parametrize("base,dims,head", [(1e7, 16, 64), (1e4, 64, 64), (5e5, 32, 128)])
@pytest.mark.parametrize("rows,length", [(1, 1), (1, 4), (3, 4), (2, 37)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("compiled", [False, True])
def test_one_rope_table_for_queries_and_keys_is_mlx_fast_rope_bit_for_bit(
        base, dims, head, rows, length, dtype, compiled):
    """``trunk.rotated`` builds the cosines and sines once for q and k (the attention's
    input function does), with ``mx.fast.rope``'s own ops: the same bits, for a scalar
    offset and one per row (a batch)."""
    import mlx.nn as nn

    rope = nn.RoPE(dims, base=base)
    rng = np.random.default_rng(rows * 100 + length)
    q = mx.array(rng.normal(size=(rows, 4, length, head)).astype(np.float32)).astype(dtype)
    k = mx.array(rng.normal(size=(rows, 2, length, head)).astype(np.float32)).astype(dtype)
    offsets = [mx.array(0, dtype=mx.int32), mx.array(12345, dtype=mx.int32),
               mx.array([7 + 5 * b for b in range(rows)], dtype=mx.int32)]

    def ours(q, k, offset):
        return trunk.rotated(rope, offset, q, k)

    def theirs(q, k, offset):
        return [rope(q, offset=offset), rope(k, offset=offset)]
    if compiled:
        ours, theirs = mx.compile(ours), mx.compile(theirs)
    for offset in offsets:
        for a, b in zip(ours(q, k, offset), theirs(q, k, offset)):
            assert a.shape == b.shape and a.dtype == b.dtype
            assert np.array_equal(np.array(a.astype(mx.float32)),
                                  np.array(b.astype(mx.float32)))
    if dtype == mx.float32 and not compiled:
        table = _nodes(*ours(q, k, offsets[1])) - _nodes(ours(q, k, offsets[1])[0])
        assert table < _nodes(theirs(q, k, offsets[1])[1])  # k's rotation reuses q's table
