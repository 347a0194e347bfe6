"""The verify's GDN recurrence on split inputs (engine/models/trunk.py ``_split_steps``) is
mlx-lm's one step (``_gated_delta_step_ops``) S times, bit for bit."""
from __future__ import annotations

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
    return outs + states


def _split(*args):
    outs, states = trunk._split_steps(*args)
    return outs + states


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
    assert len(want) == len(have) == 2 * steps
    for a, b in zip(want, have):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)))
