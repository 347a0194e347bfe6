"""The logistic sigmoid and SiLU over a prefill's large arrays on the CPU branch.

On the CPU, MLX's ``exp`` (and ``sigmoid``, which calls it) is a scalar call per element:
20-40 ns each here (Intel Xeon, MLX 0.32.4), against 0.3 ns for a multiply. A prompt chunk
passes ~7.7k elements a token through a sigmoid (each MLP's SiLU, each GDN layer's conv SiLU
and gated norm), a fifth of a short prompt's prefill. The form below computes the exponential
as MLX's kernel does (Cephes' polynomial for 2^f, 2^n from the bits of a float32), but in
element-wise operations that ``mx.compile`` fuses into one pass: about twice as fast from a few
thousand elements (a 24 x 512 SiLU 0.24 -> ~0.12 ms, 512 x 512 4.8 -> 2.5 ms), within a float32
rounding or two of MLX's (its polynomial uses fused multiply-adds).

Only for prefill-sized arrays (``large``): on a decode step's few hundred elements the fused
kernels' launches cost more than the scalar calls (tried inside the compiled decode layers:
depth 0 and depth 3 got 5-15 % slower). Plain and MTP decoding share the prefill, so greedy
MTP decoding still equals plain decoding token for token.
"""
from __future__ import annotations

import mlx.core as mx

# 2^f on |f| <= 1/2: Cephes' polynomial, highest power first (MLX's CPU ``exp``'s constants)
_EXP2 = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
         5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1, 1.0)
LARGE = 8192  # elements from which ``silu``/``sigmoid`` take the fused form


def _parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """For float32 x: (2^f, the bits of 2^n) with e^|x| = 2^f 2^n (n clipped to the
    exponent's range; past 88, where e^|x| overflows, ``_finish`` gives inf)."""
    t = mx.abs(x) * 1.442695
    n = mx.floor(t + 0.5)
    f = t - n
    p = _EXP2[0]
    for c in _EXP2[1:]:
        p = p * f + c
    return p, (mx.minimum(n, 127.0).astype(mx.int32) + 127) << 23


def _finish(x: mx.array, p: mx.array, two_n: mx.array, times: mx.array | None):
    """sigmoid(x) from e^|x| = p * two_n, as MLX's kernel: 1 / (1 + e^|x|), mirrored for
    x >= 0 (times ``times`` when given: the SiLU)."""
    e = mx.where(mx.abs(x) > 88.0, mx.inf, p * two_n)
    y = 1.0 / (1.0 + e)
    s = mx.where(x < 0, y, 1.0 - y)
    return s if times is None else s * times


# shapeless: a prompt's length changes every turn (``view`` cannot be traced shapeless, so it
# runs between the two fused parts)
_parts_c = mx.compile(_parts, shapeless=True)
_finish_c = mx.compile(lambda x, p, two_n: _finish(x, p, two_n, None), shapeless=True)
_finish_silu_c = mx.compile(lambda x, p, two_n: _finish(x, p, two_n, x), shapeless=True)


def large(x: mx.array) -> bool:
    return x.size >= LARGE


def sigmoid(x: mx.array) -> mx.array:
    """``mx.sigmoid(x)``, fused for a large float32 ``x`` (else MLX's)."""
    if not large(x) or x.dtype != mx.float32:
        return mx.sigmoid(x)
    p, bits = _parts_c(x)
    return _finish_c(x, p, bits.view(mx.float32))


def silu(x: mx.array) -> mx.array:
    """``nn.silu(x)`` (x times its sigmoid), fused for a large float32 ``x`` (else MLX's)."""
    if not large(x) or x.dtype != mx.float32:
        return x * mx.sigmoid(x)
    p, bits = _parts_c(x)
    return _finish_silu_c(x, p, bits.view(mx.float32))
