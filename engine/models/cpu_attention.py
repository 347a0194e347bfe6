"""Scaled dot-product attention for the CPU branch's decode steps, verify forwards and MTP
draft steps: the query heads that share a key/value head are folded into its rows, so the
scores are one matrix product per key/value head instead of a broadcast over the repeats.

MLX's ``mx.fast.scaled_dot_product_attention`` has fused kernels on Metal; on the CPU it runs
a composed fallback that broadcasts every key/value head over its query heads. Reading the
cache is what a decode step's attention costs at long context, and that fallback read it at
a fraction of what the folded product does: 1.5x faster on the demo's shapes (4 query heads,
2 key/value heads of 64, 16k tokens: 3.3 against 2.2 ms a layer), 3.3x on Qwen3.5-0.8B's
(8 and 2 heads of 256: 30.9 against 9.5 ms). Same arithmetic per score (one query row times
the keys, scaled, a float32 softmax, times the values), except the softmax's exponential
(``softmax``: MLX's is a scalar call per element on the CPU, the attention's cost at long
context): within a few float32 roundings of the fast path's.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np


def attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask) -> mx.array:
    """Attention of ``q`` [B, Hq, L, D] over ``k``/``v`` [B, Hkv, S, D(v)]; ``mask``: None,
    ``"causal"`` (query i sees keys up to S - L + i) or an array broadcastable to
    [B, Hq, L, S] (bool: True keeps; else added to the scores), as the fast path takes."""
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    scores = (q.reshape(B, Hkv, rep * L, D) * scale) @ k.swapaxes(-1, -2)  # [B, Hkv, rep*L, S]
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        if L > 1:
            keep = mx.arange(S)[None] <= (mx.arange(L)[:, None] + (S - L))
            scores = mx.where(mx.tile(keep, (rep, 1)), scores, -mx.inf)
    elif mask is not None:
        m = mask
        while m.ndim < 4:
            m = m[None]
        if m.shape[1] == 1:   # the same for every head: repeat it for the folded rows
            m = mx.tile(m, (1, 1, rep, 1))
        else:                 # per query head: [B, Hq, L, S] -> [B, Hkv, rep*L, S]
            m = m.reshape(m.shape[0], Hkv, rep * m.shape[2], m.shape[3])
        if m.dtype == mx.bool_:
            scores = mx.where(m, scores, -mx.inf)
        else:
            scores = scores + m.astype(scores.dtype)
    probs = softmax(scores)
    return (probs @ v).reshape(B, Hq, L, v.shape[-1])


# 2^f on |f| <= 1/2: Cephes' exp2f minimax polynomial (highest power first)
_EXP2 = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
         5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1, 1.0)
_LOG2E = 1.4426950408889634


def exp_parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """e^x for x <= 0 as 2^f (a polynomial) times 2^n (the bits of a float32: n + 127 in
    its exponent field; n >= -127, where the bits are 0 and so is the product)."""
    y = mx.maximum(x * _LOG2E, -127.0)
    n = mx.round(y)
    f = y - n
    p = _EXP2[0]
    for c in _EXP2[1:]:
        p = p * f + c
    return p, (n.astype(mx.int32) + 127) << 23


# shapeless: the key count grows by one every step (``view`` cannot be traced shapeless,
# so the last multiply runs outside)
_exp_parts_compiled = mx.compile(exp_parts, shapeless=True)


def softmax(scores: mx.array) -> mx.array:
    """``mx.softmax(scores, axis=-1, precise=True)`` with its exponential computed as above.

    On the CPU, MLX's ``exp`` is a scalar call per element (16 ns here: 90 % of a decode
    step's attention at 16k tokens); this one is 5 ns, within 5e-7 relative of float64's
    (a float32 rounding or two; MLX's own is within 2e-7), and a softmax 2.4x faster. -inf
    (masked) scores give 0, NaN stays NaN."""
    x = scores.astype(mx.float32)
    x = x - mx.max(x, axis=-1, keepdims=True)
    p, bits = _exp_parts_compiled(x)
    e = p * bits.view(mx.float32)
    return (e / mx.sum(e, axis=-1, keepdims=True)).astype(scores.dtype)


# A prefill chunk's attention runs on the host (``host_attention``) from this many queries and
# this many scores per query head (queries x keys): below, MLX's graph is as fast or the
# scores are small enough to stay in cache.
HOST_MIN_QUERIES = 16
HOST_MIN_SCORES = 1 << 20
HOST_TILE = 128  # query rows per block of scores (128 x 32k float32 scores: 16 MiB)


def host_applies(queries: int, keys: int) -> bool:
    """Whether a CPU forward of ``queries`` new positions over ``keys`` keys (a prefill chunk)
    computes its attention with ``host_attention``."""
    return queries >= HOST_MIN_QUERIES and queries * keys >= HOST_MIN_SCORES


def host_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask) -> mx.array:
    """``attention`` for a prefill chunk, computed now with NumPy on the host (it evaluates
    ``q``, ``k`` and ``v``): per query head and block of ``HOST_TILE`` queries, the scores
    (one product), the mask, a float32 softmax whose normalisation divides the output rows,
    not the scores, and the product with the values.

    Why: a prefill chunk's scores are queries x keys per head (512 x 19k on the demo at 19k
    tokens: 39M floats per layer), and MLX's CPU element-wise kernels (scalar, each pass a
    new buffer of that size) spent 15-30 ns a score on the mask and softmax, 80 % of the
    attention (1.0 s a layer against 0.13 s for the scores' product); NumPy's vectorised
    ``exp`` takes 0.5 ns. Only prefill takes this path (``host_applies``): decode steps,
    verifies and draft steps keep ``attention``, whose bits they share. The same arithmetic
    up to float32 rounding (tested against MLX's fast path)."""
    B, Hq, L, _ = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    f32 = [x if x.dtype == mx.float32 else x.astype(mx.float32) for x in (q, k, v)]
    mx.eval(*f32)
    qn, kn, vn = (np.asarray(x) for x in f32)
    masks = _host_mask(mask, L)
    out = np.empty((B, Hq, L, vn.shape[-1]), dtype=np.float32)
    tri = np.triu(np.ones((HOST_TILE, HOST_TILE), dtype=bool), 1)
    for b in range(B):
        for h in range(Hq):
            keys, values = kn[b, h // rep], vn[b, h // rep]
            for r0 in range(0, L, HOST_TILE):
                r1 = min(L, r0 + HOST_TILE)
                s = (qn[b, h, r0:r1] * np.float32(scale)) @ keys.T  # [rows, S]
                if isinstance(masks, str):  # causal: query i sees keys up to S - L + i
                    c0 = S - L + r0
                    s[:, c0:c0 + (r1 - r0)][tri[:r1 - r0, :r1 - r0]] = -np.inf
                    s[:, c0 + (r1 - r0):] = -np.inf
                elif masks is not None:
                    m = masks[b if masks.shape[0] > 1 else 0, h if masks.shape[1] > 1 else 0]
                    m = m[r0:r1] if m.shape[0] > 1 else m
                    if m.dtype == np.bool_:
                        s = np.where(m, s, np.float32(-np.inf))
                    else:
                        s += m
                s -= s.max(axis=-1, keepdims=True)
                np.exp(s, out=s)
                total = s.sum(axis=-1, keepdims=True)
                out[b, h, r0:r1] = (s @ values) / total
    res = mx.array(out)
    return res if q.dtype == mx.float32 else res.astype(q.dtype)


def _host_mask(mask, queries: int):
    """``mask`` for ``host_attention`` over ``queries`` rows: None, "causal", or a NumPy array
    [B|1, Hq|1, L|1, S] (bool: True keeps; else float32, added)."""
    if mask is None or isinstance(mask, str):
        if isinstance(mask, str) and mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        return mask if queries > 1 else None
    m = mask
    while m.ndim < 4:
        m = m[None]
    if m.dtype != mx.bool_:
        m = m.astype(mx.float32)
    return np.asarray(m)
