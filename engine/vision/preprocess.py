"""Qwen's image preprocessing in numpy: resize to the pixel budget on the patch grid,
normalize, patchify (what transformers' ``Qwen2VLImageProcessor`` does, without torch).

- ``fit_size``: the height and width the image is resized to: each a multiple of
  ``patch_size * merge_size`` (one merged token covers that square), as close to the
  original as the budget ``min_pixels..max_pixels`` allows (Qwen's ``smart_resize``).
- ``resize``: separable bicubic resampling (a = -0.5, the kernel widened by the scale when
  shrinking, so a downscale averages instead of aliasing), as Pillow's ``BICUBIC`` does;
  float arithmetic, rounded back to uint8 as Pillow rounds.
- ``patchify``: (grid_t * grid_h * grid_w, C * T * P * P) rows in the encoder's order: the
  image repeated to ``temporal_patch_size`` frames, patches in merge-block order (each
  ``merge_size`` x ``merge_size`` block of patches consecutive), each patch flattened
  channel, frame, row, column (the layout of the patch embedding's Conv3d weight).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ImageConfig:
    """The model's preprocessing numbers (``preprocessor_config.json``, else Qwen3.5's)."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_folder(cls, folder: Path, vision_config: dict) -> "ImageConfig":
        """The folder's ``preprocessor_config.json`` (read as plain JSON) over the vision
        config's patch numbers; Qwen3.5's defaults for anything missing."""
        raw: dict = {}
        path = Path(folder) / "preprocessor_config.json"
        if path.is_file() and path.stat().st_size < 1 << 20:
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raw = {}
        if not isinstance(raw, dict):
            raw = {}
        size = raw.get("size") if isinstance(raw.get("size"), dict) else {}
        d = cls()
        return cls(
            patch_size=int(vision_config.get("patch_size", raw.get("patch_size", d.patch_size))),
            merge_size=int(vision_config.get("spatial_merge_size",
                                             raw.get("merge_size", d.merge_size))),
            temporal_patch_size=int(vision_config.get(
                "temporal_patch_size", raw.get("temporal_patch_size", d.temporal_patch_size))),
            min_pixels=int(size.get("shortest_edge", raw.get("min_pixels", d.min_pixels))),
            max_pixels=int(size.get("longest_edge", raw.get("max_pixels", d.max_pixels))),
            mean=tuple(float(x) for x in raw.get("image_mean", d.mean)),
            std=tuple(float(x) for x in raw.get("image_std", d.std)))


def fit_size(height: int, width: int, cfg: ImageConfig) -> tuple[int, int]:
    """Qwen's ``smart_resize``: (h, w) multiples of ``cfg.factor`` within the pixel budget."""
    f = cfg.factor
    if max(height, width) / max(1, min(height, width)) > 200:
        raise ValueError(f"The image is {width}x{height}: an aspect ratio over 200 cannot be "
                         "encoded; crop it.")
    h = max(f, round(height / f) * f)
    w = max(f, round(width / f) * f)
    if h * w > cfg.max_pixels:
        beta = math.sqrt(height * width / cfg.max_pixels)
        h = max(f, math.floor(height / beta / f) * f)
        w = max(f, math.floor(width / beta / f) * f)
    elif h * w < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (height * width))
        h = math.ceil(height * beta / f) * f
        w = math.ceil(width * beta / f) * f
    return h, w


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def _weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's resampling taps for one axis: (indices [n_out, K], weights [n_out, K])."""
    scale = n_in / n_out
    support = 2.0 * max(scale, 1.0)
    fscale = max(scale, 1.0)
    centers = (np.arange(n_out) + 0.5) * scale
    k = int(math.ceil(support)) * 2 + 1
    first = np.floor(centers - support + 0.5).astype(np.int64)
    idx = first[:, None] + np.arange(k)[None, :]
    w = _cubic((idx + 0.5 - centers[:, None]) / fscale)
    valid = (idx >= 0) & (idx < n_in)
    w = np.where(valid, w, 0.0)
    w = w / w.sum(axis=1, keepdims=True)
    return np.clip(idx, 0, n_in - 1), w


def resize(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (height, width, 3) uint8, bicubic with antialiasing."""
    if pixels.shape[:2] == (height, width):
        return pixels
    x = pixels.astype(np.float32)
    iw, ww = _weights(x.shape[1], width)
    x = np.einsum("hwkc,wk->hwc", x[:, iw, :], ww.astype(np.float32))
    x = np.clip(np.round(x), 0, 255)  # Pillow keeps 8 bits between the passes
    ih, wh = _weights(x.shape[0], height)
    x = np.einsum("hkwc,hk->hwc", x[ih, :, :], wh.astype(np.float32))
    return np.clip(np.round(x), 0, 255).astype(np.uint8)


def patchify(pixels: np.ndarray, cfg: ImageConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """A resized (H, W, 3) uint8 image -> (float32 patch rows, (grid_t, grid_h, grid_w))."""
    x = pixels.astype(np.float32) * np.float32(1 / 255)
    x = (x - np.asarray(cfg.mean, np.float32)) / np.asarray(cfg.std, np.float32)
    x = np.transpose(x, (2, 0, 1))  # C, H, W
    T, P, M = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    x = np.broadcast_to(x[None], (T,) + x.shape)  # one frame repeated T times
    C, H, W = x.shape[1:]
    gh, gw = H // P, W // P
    x = x.reshape(1, T, C, gh // M, M, P, gw // M, M, P)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gh * gw, C * T * P * P)), (1, gh, gw)


@dataclass(frozen=True)
class Prepared:
    """One image ready for the encoder: patch rows, its grid, and the merged token count."""

    patches: np.ndarray
    grid: tuple[int, int, int]
    tokens: int


def prepare(pixels: np.ndarray, cfg: ImageConfig) -> Prepared:
    """Resize, normalize and patchify one decoded image ((H, W, 3) uint8 RGB)."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise ValueError("An image must be (height, width, 3) uint8 RGB pixels.")
    h, w = fit_size(pixels.shape[0], pixels.shape[1], cfg)
    patches, grid = patchify(resize(pixels, h, w), cfg)
    return Prepared(patches, grid, grid[0] * grid[1] * grid[2] // cfg.merge_size ** 2)


def token_count(height: int, width: int, cfg: ImageConfig) -> int:
    """How many prompt tokens an image of this size becomes (no pixels needed)."""
    h, w = fit_size(height, width, cfg)
    return (h // cfg.factor) * (w // cfg.factor)
