"""Qwen3.5/3.6's vision tower in MLX: the same math as transformers' ``Qwen3_5VisionModel``
(the reference the parity test compares against), parameters named as the checkpoint's
``model.visual.*`` tensors so raw and converted checkpoints load alike.

patch rows (``engine.vision.preprocess.patchify``) -> patch embedding (the Conv3d, whose
kernel equals its stride, is one matmul over the flattened patch) + the learned position
table resampled bilinearly (corners aligned) to the image's grid -> ``depth`` pre-norm blocks
(LayerNorm, full attention within each image with 2-D rotary positions, GELU-tanh MLP) ->
the merger (LayerNorm, each merge_size x merge_size block of patches concatenated, two
linears with exact GELU between) = one embedding per image token, in the trunk's width.
Own module rather than mlx-vlm: exactness needs the reference's math and names, and mlx-vlm
would bring opencv, datasets and mlx-audio into the desktop bundle for ~300 lines.
"""
from __future__ import annotations


import mlx.core as mx
import mlx.nn as nn
import numpy as np

PREFIX = "model.visual."


class PatchEmbed(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        c, t, p = cfg.get("in_channels", 3), cfg["temporal_patch_size"], cfg["patch_size"]
        d = cfg["hidden_size"]
        # the checkpoint's Conv3d weight [D, C, T, P, P]; kernel == stride: a matmul
        self.proj = {"weight": mx.zeros((d, c, t, p, p)), "bias": mx.zeros((d,))}

    def __call__(self, x: mx.array) -> mx.array:
        w = self.proj["weight"]
        return x @ w.reshape(w.shape[0], -1).T + self.proj["bias"]


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array, spans: list[int]) -> mx.array:
        n, d = x.shape
        q, k, v = self.qkv(x).reshape(n, 3, self.heads, -1).transpose(1, 2, 0, 3)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        scale = (d // self.heads) ** -0.5
        outs, start = [], 0
        for length in spans:  # attention within each image only
            s = slice(start, start + length)
            outs.append(mx.fast.scaled_dot_product_attention(
                q[None, :, s], k[None, :, s], v[None, :, s], scale=scale)[0])
            start += length
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)
        return self.proj(out.transpose(1, 0, 2).reshape(n, d))


def _rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """``x * cos + rotate_half(x) * sin`` over the whole head (float32, as the reference)."""
    half = x.shape[-1] // 2
    rot = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x.astype(mx.float32) * cos + rot.astype(mx.float32) * sin).astype(x.dtype)


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, hidden, bias=True)
        self.linear_fc2 = nn.Linear(hidden, dim, bias=True)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_fc2(nn.gelu_approx(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        d = cfg["hidden_size"]
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.attn = VisionAttention(d, cfg["num_heads"])
        self.mlp = VisionMLP(d, cfg["intermediate_size"])

    def __call__(self, x, cos, sin, spans):
        x = x + self.attn(self.norm1(x), cos, sin, spans)
        return x + self.mlp(self.norm2(x))


class Merger(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        d = cfg["hidden_size"]
        self.merged = d * cfg["spatial_merge_size"] ** 2
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged, self.merged, bias=True)
        self.linear_fc2 = nn.Linear(self.merged, cfg["out_hidden_size"], bias=True)

    def __call__(self, x: mx.array) -> mx.array:
        x = self.norm(x).reshape(-1, self.merged)
        return self.linear_fc2(nn.gelu(self.linear_fc1(x)))


def vision_defaults(cfg: dict) -> dict:
    """The vision config with transformers' defaults for what it leaves out."""
    out = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
           "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
           "temporal_patch_size": 2, "out_hidden_size": 3584, "num_position_embeddings": 2304,
           "hidden_act": "gelu_pytorch_tanh"}
    out.update({k: v for k, v in cfg.items() if v is not None})
    rope = out.get("rope_parameters") or {}
    out["rope_theta"] = float(rope.get("rope_theta", 10000.0))
    return out


def quantize(enc: "VisionEncoder", *, bits: int, group_size: int) -> dict:
    """Quantize the encoder's linear layers (attention, MLP, merger) in place; the patch
    embedding and the position table stay float (the table is interpolated, not looked up).
    The same choice at convert and at load: which layers fit the group size follows from
    the config alone. Returns the config entry (``vision_quantization``)."""
    nn.quantize(enc, group_size=group_size, bits=bits,
                class_predicate=lambda _p, m: isinstance(m, nn.Linear)
                and m.weight.shape[-1] % group_size == 0)
    return {"group_size": group_size, "bits": bits}


class VisionEncoder(nn.Module):
    """See the module docstring. ``__call__(patches, grids)``: the patch rows of one or more
    images (concatenated) and their (t, h, w) grids -> [tokens, out_hidden_size]."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        cfg = vision_defaults(cfg)
        if cfg["hidden_act"] != "gelu_pytorch_tanh":
            raise ValueError(f"vision hidden_act {cfg['hidden_act']!r} is not supported")
        self.cfg = cfg
        self.merge = cfg["spatial_merge_size"]
        self.side = int(cfg["num_position_embeddings"] ** 0.5)
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg["num_position_embeddings"], cfg["hidden_size"])
        self.blocks = [VisionBlock(cfg) for _ in range(cfg["depth"])]
        self.merger = Merger(cfg)
        head_dim = cfg["hidden_size"] // cfg["num_heads"]
        quarter = head_dim // 2
        self._inv_freq = 1.0 / (cfg["rope_theta"] ** (
            np.arange(0, quarter, 2, dtype=np.float32) / quarter))

    def __call__(self, patches: mx.array, grids: list[tuple[int, int, int]]) -> mx.array:
        idx, wts, rows, cols = _grid_tables(grids, self.side, self.merge)
        x = self.patch_embed(patches.astype(self.patch_embed.proj["weight"].dtype))
        pos = (self.pos_embed(mx.array(idx)) * mx.array(wts)[..., None]).sum(axis=1)
        x = x + pos.astype(x.dtype)
        freqs = np.concatenate([rows[:, None] * self._inv_freq, cols[:, None] * self._inv_freq],
                               axis=-1).astype(np.float32)
        angles = mx.array(np.concatenate([freqs, freqs], axis=-1))[None]  # [1, N, head_dim]
        cos, sin = mx.cos(angles), mx.sin(angles)
        spans = [t * h * w for t, h, w in grids]
        for block in self.blocks:
            x = block(x, cos, sin, spans)
        return self.merger(x)

    def sanitize(self, weights: dict) -> dict:
        """``model.visual.*`` (or ``visual.*``) tensors -> this module's names."""
        out = {}
        for k, v in weights.items():
            for p in (PREFIX, "visual."):
                if k.startswith(p):
                    out[k[len(p):]] = v
                    break
        return out


def _grid_tables(grids, side: int, merge: int):
    """Per patch, in merge-block order: the 4 bilinear taps into the ``side`` x ``side``
    position table (corners aligned) and their weights, and the patch's row and column."""
    idx, wts, rows, cols = [], [], [], []
    for t, h, w in grids:
        r = np.arange(h).reshape(h // merge, merge)[:, None, :, None]
        c = np.arange(w).reshape(w // merge, merge)[None, :, None, :]
        r, c = np.broadcast_arrays(r, c)
        r, c = r.reshape(-1), c.reshape(-1)
        (hi, hw), (wi, ww) = _taps(r, h, side), _taps(c, w, side)
        i = (hi[:, :, None] * side + wi[:, None, :]).reshape(-1, 4)
        wt = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
        for _ in range(t):
            idx.append(i)
            wts.append(wt)
            rows.append(r)
            cols.append(c)
    return (np.concatenate(idx), np.concatenate(wts).astype(np.float32),
            np.concatenate(rows).astype(np.float32), np.concatenate(cols).astype(np.float32))


def _taps(index: np.ndarray, size: int, side: int):
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
    weights = np.clip(1 - np.abs(src[:, None] - floor[:, None] - np.arange(2)), 0, None)
    return taps, weights.astype(np.float32)


def build_encoder(vision_config: dict, weights: dict) -> VisionEncoder:
    """The encoder with the checkpoint's vision tensors in place (strict: every parameter)."""
    enc = VisionEncoder(vision_config)
    w = enc.sanitize(weights)
    enc.load_weights(list(w.items()), strict=True)
    return enc


def param_count(enc: VisionEncoder) -> int:
    from mlx.utils import tree_flatten

    return int(sum(v.size for _, v in tree_flatten(enc.parameters())))


__all__ = ["VisionEncoder", "build_encoder", "param_count"]
