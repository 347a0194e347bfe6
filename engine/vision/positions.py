"""M-RoPE (multimodal rotary positions) of Qwen3.5/3.6, as transformers computes them.

Every prompt token has three position ids (temporal, height, width). A text token's three are
equal and count up by one; an image's tokens sit on their (row, column) grid from the position
after the text before it (temporal = that start, height = start + row, width = start + column),
and the text after the image continues from ``start + max(rows, cols)``. So past an image a
token's position is its index plus a (negative) ``delta``: decode steps only add ``delta`` to
the cache's offset (``engine.models.trunk.shifted_offset``), and text-only prompts (delta 0)
run exactly as before.

The rotation: frequency i of the rotary half takes its angle from the temporal, height or
width id, interleaved (``mrope_section`` [t, h, w]: index 1, 4, 7, .. < 3h from height, 2, 5,
.. < 3w from width, the rest temporal), then the usual rotate-half over the first ``dims``.
For equal ids this is the ordinary RoPE.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np


def prompt_positions(n_tokens: int, images: list[tuple[int, int, int, int]], start: int = 0,
                     ) -> tuple[np.ndarray, int]:
    """([3, n_tokens] position ids, delta) for a span of ``n_tokens`` whose first token sits at
    position ``start``. ``images``: (first token index within the span, t, rows, cols) of each
    image's merged token grid, in order. ``delta`` = next position - (``start`` + n_tokens)."""
    pos = np.zeros((3, n_tokens), np.int64)
    cur, i = start, 0
    for first, t, rows, cols in sorted(images):
        n = first - i
        pos[:, i:first] = cur + np.arange(n)
        cur += n
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
        span = t * rows * cols
        pos[0, first:first + span] = cur + tt.reshape(-1)
        pos[1, first:first + span] = cur + hh.reshape(-1)
        pos[2, first:first + span] = cur + ww.reshape(-1)
        cur += max(rows, cols)
        i = first + span
    pos[:, i:] = cur + np.arange(n_tokens - i)
    cur += n_tokens - i
    return pos, int(cur - (start + n_tokens))


class MRoPE:
    """The trunk's rotation for explicit 3-D positions (one per attention shape)."""

    def __init__(self, dims: int, base: float, section: list[int]) -> None:
        self.dims = dims
        self.inv_freq = (1.0 / (base ** (np.arange(0, dims, 2, dtype=np.float32) / dims))
                         ).astype(np.float32)
        axis = np.zeros(dims // 2, np.int64)
        h, w = (list(section) + [0, 0, 0])[1:3]
        axis[1:3 * h:3] = 1
        axis[2:3 * w:3] = 2
        self.axis = axis

    @classmethod
    def for_attention(cls, attn, text_args) -> "MRoPE":
        rope = attn.rope
        params = getattr(text_args, "rope_parameters", None) or {}
        section = params.get("mrope_section") or [attn.head_dim // 2, 0, 0]
        return cls(int(rope.dims), float(rope.base), list(section))

    def tables(self, positions: np.ndarray) -> tuple[mx.array, mx.array]:
        """cos, sin [S, dims] for positions [3, S] (angles in float32, as transformers)."""
        freqs = positions[self.axis].T.astype(np.float32) * self.inv_freq  # [S, dims/2]
        emb = mx.array(np.concatenate([freqs, freqs], axis=-1))
        return mx.cos(emb), mx.sin(emb)

    def apply(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        """x [B, heads, S, head_dim] rotated on its first ``dims`` features."""
        d = self.dims
        rot, rest = x[..., :d], x[..., d:]
        half = d // 2
        turned = mx.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
        out = (rot * cos.astype(x.dtype) + turned * sin.astype(x.dtype))
        return mx.concatenate([out, rest], axis=-1) if rest.shape[-1] else out
