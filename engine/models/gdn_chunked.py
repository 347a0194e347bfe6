"""The gated delta rule over a whole prompt chunk at once (the CPU branch's prefill).

mlx-lm runs a prompt's Gated DeltaNet recurrence with its Metal kernel on a Mac; anywhere else
``gated_delta_ops`` takes one token at a time, about ten small operations per token and layer,
so on the CPU a prefill costs about as much per token as a decode step (1.1 ms a token on the
demo, 560 ms for 500 tokens). The same recurrence, per head with the state ``S`` (Dv x Dk),

    S_t = g_t S_{t-1} + beta_t (v_t - g_t S_{t-1} k_t) k_t^T,        o_t = S_t q_t,

is computed here ``chunk`` tokens at a time in the chunkwise (WY) form that
flash-linear-attention's ``chunk_gated_delta_rule`` and transformers' torch reference use:
within a chunk the interactions are small matrix products and one unit-lower-triangular
inverse; only the state between chunks is sequential. Same results up to float rounding
(within 1e-6 of the step-by-step form on the test models, tested); the decode step and the
verify forward keep mlx-lm's step-by-step arithmetic, and plain decoding and MTP decoding share
this prefill, so greedy MTP still equals plain decoding token for token.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from engine.models.cpu_attention import exp_parts

CHUNK = 32  # tokens per chunk: 32 measured fastest on the demo's shapes, 28-2000 tokens


def depthwise_conv(conv1d, x: mx.array) -> mx.array:
    """``conv1d(x)`` for the GDN's depthwise causal conv (no padding, weight [C, K, 1]) as K
    shifted multiply-adds: 4x faster than MLX's grouped convolution on the CPU for a prompt
    (1.2 against 4.7 ms for 500 tokens on the demo), equal up to float rounding."""
    w = conv1d.weight
    K, n = w.shape[1], x.shape[1] - w.shape[1] + 1
    out = x[:, 0:n] * w[:, 0, 0]
    for j in range(1, K):
        out = out + x[:, j:j + n] * w[:, j, 0]
    bias = getattr(conv1d, "bias", None)
    return out if bias is None else out + bias


def log_decay(A_log: mx.array, a: mx.array, dt_bias: mx.array) -> mx.array:
    """log g of mlx-lm's ``compute_g`` (g = exp(-exp(A_log) softplus(a + dt_bias)))."""
    return -mx.exp(A_log.astype(mx.float32)) * nn.softplus(a + dt_bias)


def chunked_gated_delta(q: mx.array, k: mx.array, v: mx.array, log_g: mx.array,
                        beta: mx.array, state: mx.array | None,
                        chunk: int = CHUNK) -> tuple[mx.array, mx.array]:
    """(outputs [B, T, Hv, Dv], final state [B, Hv, Dv, Dk]) of the gated delta rule.

    ``q``, ``k``: [B, T, Hk, Dk], normalised as mlx-lm's ``normalize_qk`` does (the readout
    scale folded into q); ``v``: [B, T, Hv, Dv]; ``log_g``, ``beta``: [B, T, Hv]; ``state``:
    [B, Hv, Dv, Dk] or None (zeros). Computed in float32; outputs in q's dtype."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    dtype = q.dtype
    if Hv // Hk > 1:
        q, k = mx.repeat(q, Hv // Hk, -2), mx.repeat(k, Hv // Hk, -2)
    if state is None:
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    C = chunk
    pad = (-T) % C  # padded steps have k = v = 0, beta = 0, log g = 0: they leave S alone
    f32 = mx.float32

    def heads_first(x: mx.array, last_dims: int) -> mx.array:
        x = x.swapaxes(1, 2).astype(f32)
        if pad:
            x = mx.pad(x, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * last_dims)
        return x.reshape(B, Hv, -1, C, *x.shape[3:])
    q, k, v = (heads_first(x, 1) for x in (q, k, v))
    log_g, beta = heads_first(log_g, 0), heads_first(beta, 0)
    out, S = _chunks(q, k, v, log_g, beta, state.swapaxes(-1, -2).astype(f32))
    out = out.reshape(B, Hv, -1, Dv)[:, :, :T].swapaxes(1, 2)
    return out.astype(dtype), S.swapaxes(-1, -2)


def exp_nonpositive(x: mx.array) -> mx.array:
    """e^x for x <= 0 (-inf: 0) in element-wise operations that the compiled ``_chunks``
    fuses: MLX's CPU ``exp`` is a scalar call per element (20-40 ns here), and the decay
    matrix is C x C per head and chunk (``engine.models.cpu_attention``'s polynomial, within
    a float32 rounding or two of MLX's)."""
    p, bits = exp_parts(x)
    return p * bits.view(mx.float32)


@mx.compile
def _chunks(q: mx.array, k: mx.array, v: mx.array, log_g: mx.array, beta: mx.array,
            S: mx.array) -> tuple[mx.array, mx.array]:
    """The recurrence over ``n`` chunks of ``C`` steps: q, k [B, Hv, n, C, Dk], v [B, Hv, n,
    C, Dv], log_g and beta [B, Hv, n, C], the state S [B, Hv, Dk, Dv] (float32) -> (outputs
    [B, Hv, n, C, Dv], final state [B, Hv, Dk, Dv]). ``mx.compile``d: one trace per (n, C) and
    head shape, since the caller pads every prompt chunk to whole chunks (the same operations,
    fused: 0.71 -> 0.26 ms for one chunk of the demo's heads, the same bits, measured)."""
    f32 = mx.float32
    n, C = q.shape[2], q.shape[3]
    gc = mx.cumsum(log_g, axis=-1)                      # log of the decay since the chunk began
    lower = mx.tril(mx.ones((C, C), dtype=mx.bool_))
    # decay[i, j] = g_{j+1} ... g_i for j <= i (0 above the diagonal, without overflow)
    decay = exp_nonpositive(mx.where(lower, gc[..., :, None] - gc[..., None, :], -mx.inf))
    kb = k * beta[..., None]
    strict = mx.where(mx.tril(mx.ones((C, C), dtype=mx.bool_), -1),
                      (kb @ k.swapaxes(-1, -2)) * decay, 0.0)
    # (I + strict)^-1 turns the chunk's coupled updates into independent ones (the WY form)
    inv = mx.linalg.tri_inv(strict + mx.eye(C, dtype=f32), upper=False, stream=mx.cpu)
    u = inv @ (v * beta[..., None])
    w = inv @ (kb * mx.exp(gc)[..., None])
    intra = (q @ k.swapaxes(-1, -2)) * decay
    q_dec = q * mx.exp(gc)[..., None]
    last = gc[..., -1:]
    k_dec = (k * mx.exp(last - gc)[..., None]).swapaxes(-1, -2)
    outs = []
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ S
        outs.append(q_dec[:, :, i] @ S + intra[:, :, i] @ v_new)
        S = S * mx.exp(last[:, :, i])[..., None] + k_dec[:, :, i] @ v_new
    return (mx.concatenate(outs, axis=2) if n > 1 else outs[0]), S
