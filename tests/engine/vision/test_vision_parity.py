"""Images against transformers: a tiny random ``Qwen3_5ForConditionalGeneration`` built and
saved by transformers (``tests.tinyvision``), loaded by the engine raw and after
``engine convert``.

- the vision embeddings equal transformers' ``get_image_features`` within float32 rounding;
- greedy replies to prompts with 0, 1 and 2 images of different sizes equal transformers'
  greedy continuation token for token (the encoder, the splice at the pads, the M-RoPE
  positions of the image tokens and of the text after them, and every decode step's shift);
- greedy MTP at depths 1-3 equals depth 0 with images (the verify rows and the head's own
  attention at the shifted positions), on both device branches.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import engine  # noqa: E402
from engine.vision.image_io import from_pixels  # noqa: E402
from engine.vision.preprocess import prepare  # noqa: E402
from tests.tinyvision import (build_tiny_vision_model, hf_greedy, hf_image_embeds,  # noqa: E402
                              hf_model, sample_image)

N_TOKENS = 14
SIZES = ((50, 70), (90, 40))  # (h, w): grids 6x8 and 12x4 patches, 12 tokens each


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from engine.models.convert import convert

    raw = build_tiny_vision_model(tmp_path_factory.mktemp("tinyvision") / "raw")
    converted = convert(raw, raw.parent / "converted")
    return {"raw": raw, "converted": converted}


@pytest.fixture(scope="module")
def reference(folders):
    return hf_model(folders["raw"])


@pytest.fixture(scope="module")
def images():
    return [from_pixels(sample_image(h, w, seed=i)) for i, (h, w) in enumerate(SIZES)]


def messages(images: list, text: str = "What is in this image?") -> list[dict]:
    parts = [{"type": "image", "image": im} for im in images]
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def greedy(model, prompt, depth: int = 0, n: int = N_TOKENS) -> list[int]:
    return [t for ev in model.generate(prompt, max_tokens=n, depth=depth) for t in ev.token_ids]


def test_loads_the_vision_tower_raw_and_converted(folders):
    for name in ("raw", "converted"):
        m = engine.load(folders[name])
        assert m.info.vision and m.vision is not None, name
    assert engine.load(folders["converted"]).info.layout == "mlx"


def test_vision_embeddings_match_transformers(folders, reference, images):
    import mlx.core as mx

    m = engine.load(folders["raw"])
    preps = [prepare(im.pixels, m.image_config) for im in images]
    assert [p.grid for p in preps] == [(1, 6, 8), (1, 12, 4)]
    mine = np.array(m.vision(mx.array(np.concatenate([p.patches for p in preps])),
                             [p.grid for p in preps]))
    ref = hf_image_embeds(reference, [p.patches for p in preps], [p.grid for p in preps])
    assert mine.shape == ref.shape == (24, 64)
    assert np.abs(ref).mean() > 0.1  # embeddings of a real size, not all but zero
    assert np.abs(mine - ref).max() < 1e-4


@pytest.mark.parametrize("layout", ["raw", "converted"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_greedy_equals_transformers(folders, reference, images, layout, n_images):
    m = engine.load(folders[layout])
    imgs = images[:n_images]
    prompt = m.chat_prompt(messages(imgs))
    assert len(getattr(prompt, "images", ())) == n_images
    preps = [prepare(im.pixels, m.image_config) for im in imgs]
    ref = hf_greedy(reference, list(prompt), m.image_token_id, [p.patches for p in preps],
                    [p.grid for p in preps], N_TOKENS)
    assert greedy(m, prompt) == ref


def test_the_image_changes_the_reply(folders, images):
    """The images really reach the trunk: other pixels, other reply."""
    m = engine.load(folders["raw"])
    a = greedy(m, m.chat_prompt(messages([images[0]])))
    flipped = from_pixels(np.ascontiguousarray(255 - images[0].pixels[::-1]))
    assert greedy(m, m.chat_prompt(messages([flipped]))) != a


def test_greedy_mtp_equals_plain_with_images(folders, images, device_branch):
    m = engine.load(folders["raw"])
    prompt = m.chat_prompt(messages(images, "Compare the two pictures."))
    plain = greedy(m, prompt, 0, 24)
    for depth in (1, 2, 3):
        assert greedy(m, prompt, depth, 24) == plain, depth


@pytest.mark.parametrize("h,w", [(768, 1024), (50, 70), (333, 517)],
                         ids=["kept", "upscaled", "downscaled"])
def test_preprocessing_matches_transformers(h, w):
    """``prepare`` against transformers' Pillow image processor (Qwen's own numbers): the
    same grid always; the same patch values when no resize is needed; after a resize the
    same up to resampling rounding (measured: upscaled max 1 level of 255, downscaled mean
    0.27 levels, max 16 on the sharpest edges)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)

    from engine.vision.preprocess import ImageConfig

    cfg = ImageConfig()
    img = sample_image(h, w, seed=0)
    ref = Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
        image_std=[0.5] * 3, size={"shortest_edge": cfg.min_pixels,
                                   "longest_edge": cfg.max_pixels})(
        images=[img], return_tensors="np")
    mine = prepare(img, cfg)
    assert tuple(int(x) for x in ref["image_grid_thw"][0]) == mine.grid
    diff = np.abs(ref["pixel_values"] - mine.patches)
    level = 2 / 255  # one 8-bit level after normalizing to [-1, 1]
    if (h, w) == (768, 1024):
        assert diff.max() < 1e-6
    else:
        assert diff.mean() < 0.5 * level and diff.max() <= 17 * level


def test_convert_can_quantize_the_vision_encoder(folders, images, tmp_path):
    """``convert --vision-bits 8``: the encoder's linear layers are packed (off by default),
    the converted model loads them back, its embeddings stay within 8-bit error of the
    float ones, speculation past the image stays exact; a model without a tower refuses."""
    import mlx.core as mx

    from engine.errors import EngineError
    from engine.models.convert import convert
    from tests.tinymodels import build_tiny_model

    out = convert(folders["raw"], tmp_path / "v8", bits=8, group_size=32, vision_bits=8)
    q = engine.load(out)
    assert q.vision is not None
    assert type(q.vision.blocks[0].attn.qkv).__name__ == "QuantizedLinear"
    assert type(engine.load(folders["converted"]).vision.blocks[0].attn.qkv).__name__ == "Linear"
    f = engine.load(folders["raw"])
    preps = [prepare(im.pixels, f.image_config) for im in images]
    patches = mx.array(np.concatenate([p.patches for p in preps]))
    grids = [p.grid for p in preps]
    ref, got = np.array(f.vision(patches, grids)), np.array(q.vision(patches, grids))
    assert 0 < np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    prompt = q.chat_prompt(messages(images, "Compare the two pictures."))
    plain = greedy(q, prompt, 0, 16)
    assert greedy(q, prompt, 3, 16) == plain
    with pytest.raises(EngineError, match="no vision encoder"):
        convert(build_tiny_model(tmp_path / "text"), tmp_path / "t8", vision_bits=8)
