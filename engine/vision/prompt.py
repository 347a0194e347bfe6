"""Prompts with images: ``ImagePrompt`` (token ids plus the images placed in them) and the
chat rendering that makes one (``chat_prompt``).

The chat template renders an image part as ``<|vision_start|><|image_pad|><|vision_end|>``;
``chat_prompt`` tokenizes that and expands each image's single pad to its token count (what
the encoder will output for it: ``engine.vision.preprocess.token_count``), so the prompt's
length is its true length (limits, budgets and caches all count it right).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import GenerationError


class NoVisionError(GenerationError):
    """An image was given to a model without a vision encoder."""


@dataclass(frozen=True)
class PlacedImage:
    """One image in a prompt: its pads are ids[start:start + tokens]; ``grid`` the encoder's
    patch grid (t, h, w) for it; ``image`` the decoded image (pixels, digest)."""

    start: int
    tokens: int
    grid: tuple[int, int, int]
    image: object  # engine.vision.image_io.DecodedImage

    @property
    def key(self) -> tuple[int, int, str]:
        """What a cache keys this image on: where it sits, its length, its content."""
        return (self.start, self.tokens, self.image.digest)


class ImagePrompt(Sequence):
    """Token ids (a sequence of ints, as a text prompt) plus ``images`` placed in them."""

    def __init__(self, ids: Sequence[int], images: Sequence[PlacedImage]) -> None:
        self.ids = list(ids)
        self.images = tuple(images)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i]

    def __iter__(self):
        return iter(self.ids)

    def __repr__(self) -> str:
        return f"ImagePrompt({len(self.ids)} tokens, {len(self.images)} images)"


def media_key(images: Sequence[PlacedImage]) -> tuple:
    return tuple(p.key for p in images)


def check_images(model, ids: list[int], images: Sequence[PlacedImage]) -> tuple:
    """The images of a prompt, checked against its ids and the model: a one-line
    ``GenerationError`` if the model has no vision encoder or a placement is wrong."""
    if not images:
        return ()
    if getattr(model, "vision", None) is None:
        raise NoVisionError(f"{model.info.name} has no vision encoder: it cannot read images. "
                            "Use a vision model (a Qwen3.5/3.6 checkpoint with its "
                            "model.visual.* tensors) or send text only.")
    if getattr(model, "decoder_factory", None) is not None:
        raise GenerationError("images are not supported on a model split across machines "
                              "yet: send text only")
    pad = model.image_token_id
    at = 0
    for p in sorted(images, key=lambda p: p.start):
        if p.start < at or p.tokens < 1 or p.start + p.tokens > len(ids) or \
                any(t != pad for t in ids[p.start:p.start + p.tokens]):
            raise GenerationError(f"the image at token {p.start} does not sit on "
                                  f"{p.tokens} image pad tokens of the prompt")
        at = p.start + p.tokens
    if sum(t == pad for t in ids) != sum(p.tokens for p in images):
        raise GenerationError("the prompt has image pad tokens without an image")
    return tuple(sorted(images, key=lambda p: p.start))


def chat_prompt(model, messages: list[dict], *, enable_thinking: bool | None = None,
                add_generation_prompt: bool = True) -> ImagePrompt | list[int]:
    """``messages`` (content: a string or a list of text and image parts) rendered through
    the model's chat template; an ``ImagePrompt`` when any part is an image, else the plain
    ids (the text path, unchanged)."""
    from engine.vision.preprocess import fit_size

    images, plain = [], []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            plain.append(m)
            continue
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image":
                images.append(part.get("image"))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        plain.append({**m, "content": parts})
    if not images:
        return model.chat_ids(messages, enable_thinking=enable_thinking,
                              add_generation_prompt=add_generation_prompt)
    if getattr(model, "vision", None) is None:
        check_images(model, [], [PlacedImage(0, 1, (1, 1, 1), images[0])])
    for img in images:
        if not hasattr(img, "pixels") or not hasattr(img, "digest"):
            raise GenerationError("an image part must hold a DecodedImage "
                                  "(engine.vision.image_io.decode_image)")
    ids = model.chat_ids(plain, enable_thinking=enable_thinking,
                         add_generation_prompt=add_generation_prompt)
    pad, cfg = model.image_token_id, model.image_config
    if sum(t == pad for t in ids) != len(images):
        raise GenerationError("This model's chat template did not render the images "
                              f"({len(images)} given, {sum(t == pad for t in ids)} placed).")
    out, placed, k = [], [], 0
    for t in ids:
        if t != pad:
            out.append(t)
            continue
        img = images[k]
        k += 1
        h, w = fit_size(img.pixels.shape[0], img.pixels.shape[1], cfg)
        grid = (1, h // cfg.patch_size, w // cfg.patch_size)
        n = (h // cfg.factor) * (w // cfg.factor)
        placed.append(PlacedImage(len(out), n, grid, img))
        out.extend([pad] * n)
    limit = model.prompt_limit() if hasattr(model, "prompt_limit") else None
    if limit is not None and len(out) > limit:
        from engine.errors import PromptTooLongError

        raise PromptTooLongError(f"The prompt with its images is {len(out)} tokens; this model "
                                 f"takes at most {limit}. Send fewer or smaller images.")
    return ImagePrompt(out, placed)
