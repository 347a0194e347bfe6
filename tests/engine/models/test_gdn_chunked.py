"""The CPU branch's chunked Gated DeltaNet prefill (engine/models/gdn_chunked.py) against the
step-by-step recurrence mlx-lm runs off Metal: the same outputs and states up to float
rounding, used for prompt chunks only, and decoding on top of it stays exact."""
from __future__ import annotations

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import compute_g, gated_delta_ops

from engine.models import device, gdn_chunked, trunk


def _inputs(T: int, *, B=1, Hk=2, Hv=4, Dk=16, Dv=8, seed=0, strong_decay=False):
    rng = np.random.default_rng(seed)

    def arr(*shape, scale=1.0):
        return mx.array((rng.standard_normal(shape) * scale).astype(np.float32))
    q, k = arr(B, T, Hk, Dk), arr(B, T, Hk, Dk)
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * Dk ** -0.5
    A_log = arr(Hv, scale=0.5) + (3.0 if strong_decay else 0.0)
    return dict(q=q, k=k, v=arr(B, T, Hv, Dv), a=arr(B, T, Hv), b=arr(B, T, Hv), A_log=A_log,
                dt_bias=arr(Hv, scale=0.5), state=arr(B, Hv, Dv, Dk, scale=0.3))


@pytest.mark.parametrize("T,chunk", [(1, 32), (7, 32), (32, 32), (45, 32), (200, 32),
                                     (200, 16), (130, 64)])
@pytest.mark.parametrize("strong_decay", [False, True])
def test_chunked_recurrence_equals_the_step_by_step_one(T, chunk, strong_decay):
    x = _inputs(T, B=2, seed=T, strong_decay=strong_decay)
    g = compute_g(x["A_log"], x["a"], x["dt_bias"])
    beta = mx.sigmoid(x["b"])
    ref_y, ref_s = gated_delta_ops(x["q"], x["k"], x["v"], g, beta, x["state"])
    y, s = gdn_chunked.chunked_gated_delta(
        x["q"], x["k"], x["v"], gdn_chunked.log_decay(x["A_log"], x["a"], x["dt_bias"]),
        beta, x["state"], chunk)
    assert y.shape == ref_y.shape and s.shape == ref_s.shape and y.dtype == ref_y.dtype
    np.testing.assert_allclose(np.array(y), np.array(ref_y), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(np.array(s), np.array(ref_s), atol=2e-5, rtol=1e-4)


def test_chunked_recurrence_starts_from_zeros_and_keeps_bfloat16_outputs():
    x = _inputs(40, seed=5)
    q, k, v = (x[n].astype(mx.bfloat16) for n in ("q", "k", "v"))
    g = compute_g(x["A_log"], x["a"], x["dt_bias"])
    beta = mx.sigmoid(x["b"])
    ref_y, ref_s = gated_delta_ops(q, k, v, g, beta, None)
    y, s = gdn_chunked.chunked_gated_delta(
        q, k, v, gdn_chunked.log_decay(x["A_log"], x["a"], x["dt_bias"]), beta, None)
    assert y.dtype == mx.bfloat16 and s.dtype == mx.float32
    np.testing.assert_allclose(np.array(y.astype(mx.float32)),
                               np.array(ref_y.astype(mx.float32)), atol=2e-2)
    np.testing.assert_allclose(np.array(s), np.array(ref_s), atol=1e-4)


def test_depthwise_conv_equals_the_layers_grouped_conv():
    conv = nn.Conv1d(24, 24, kernel_size=4, groups=24, bias=False)
    x = mx.random.normal((2, 50, 24), key=mx.random.key(1))
    np.testing.assert_allclose(np.array(gdn_chunked.depthwise_conv(conv, x)),
                               np.array(conv(x)), atol=1e-5)


_REAL = gdn_chunked.chunked_gated_delta


def _prefill(model, ids, monkeypatch, minimum):
    monkeypatch.setattr(trunk, "CHUNKED_PREFILL_MIN", minimum)
    calls = []

    def spy(*a, **kw):
        calls.append(a[0].shape)
        return _REAL(*a, **kw)
    monkeypatch.setattr(gdn_chunked, "chunked_gated_delta", spy)
    cache = model.trunk.make_cache()
    h, _ = trunk.forward_hidden(model.text_model, mx.array(ids), cache)
    out = [h] + [x for c in cache for x in c.state if isinstance(x, mx.array)]
    mx.eval(out)
    return out, calls


def test_a_cpu_prefill_runs_the_chunked_recurrence_and_matches_mlx_lms_layers(tiny_model,
                                                                              monkeypatch):
    ids = np.random.default_rng(2).integers(3, 380, size=(1, 70)).tolist()
    with device.use_branch("cpu"):
        stepped, none = _prefill(tiny_model, ids, monkeypatch, 10 ** 9)
        chunked, calls = _prefill(tiny_model, ids, monkeypatch, 8)
        _, short = _prefill(tiny_model, [ids[0][:5]], monkeypatch, 8)  # too short: steps
    n_linear = sum(layer.is_linear for layer in tiny_model.text_model.model.layers)
    assert none == [] and short == [] and len(calls) == n_linear > 0
    assert len(stepped) == len(chunked)
    for a, b in zip(stepped, chunked):
        a, b = np.array(a), np.array(b)
        assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(a).max())  # float32 rounding
    with device.use_branch("metal"):  # the other branch runs mlx-lm's layers as they are
        _, metal = _prefill(tiny_model, ids, monkeypatch, 8)
    assert metal == []


def test_greedy_mtp_equals_plain_after_a_long_chunked_prompt(tiny_model):
    from engine.core.carryover import carryover_of

    prompt = np.random.default_rng(9).integers(3, 380, size=300).tolist()
    outs = []
    for depth in (0, 1, 3):
        carryover_of(tiny_model).reset_prompt_cache()
        outs.append([t for ev in tiny_model.generate(prompt, max_tokens=24, depth=depth)
                     for t in ev.token_ids])
    assert len(outs[0]) == 24 and outs[0] == outs[1] == outs[2]
