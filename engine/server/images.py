"""Images in requests: OpenAI ``image_url`` / ``input_image`` parts and Anthropic ``image``
blocks turned into decoded images (``engine.vision.image_io``), with the server's limits.

- ``data:`` URLs (base64) and Anthropic ``base64`` sources are decoded here; remote
  ``http(s)`` URLs are refused with a 400 unless the server was started with
  ``--allow-remote-images`` (a local server must not fetch URLs for any web page that can
  reach it); then they are fetched with the same byte limit and a short timeout.
- Limits (``ImageLimits``: bytes per image, pixels per image, images per request) and every
  bad image are a 400 in the API's own error shape (``ApiError``), one line.
- A model without a vision encoder gets a 400 saying so before anything is decoded.

``collect`` walks template messages (content lists holding ``{"type": "image", "source":
...}`` placeholders made by the API parsers) and replaces each placeholder's source by the
decoded image, the form ``Model.chat_prompt`` takes (``engine/vision/__init__.py``).
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

from engine.server.errors import ApiError, bad_request
from engine.vision.image_io import DEFAULT_LIMITS, ImageError, ImageLimits

REMOTE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ImagePolicy:
    """What the server accepts: the limits, and whether it may fetch http(s) URLs."""

    limits: ImageLimits = field(default_factory=lambda: DEFAULT_LIMITS)
    allow_remote: bool = False


def placeholder(source: dict) -> dict:
    """A content part standing for an image until ``collect`` decodes it. ``source``:
    ``{"url": str}`` or ``{"base64": str, "media_type": str}``, plus ``where`` and ``param``
    (for error messages)."""
    return {"type": "image", "source": source}


def has_images(messages: list[dict]) -> bool:
    return any(isinstance(m.get("content"), list) and
               any(p.get("type") == "image" for p in m["content"] if isinstance(p, dict))
               for m in messages)


def refuse_without_vision(info, param: str) -> None:
    if not getattr(info, "vision", False):
        raise bad_request(f"The model {info.name!r} has no vision encoder: it cannot read "
                          "images. Send text only, or serve a vision model (a Qwen3.5/3.6 "
                          "checkpoint with its model.visual.* tensors).", param)


def collect(messages: list[dict], policy: ImagePolicy, info, param: str) -> list[dict]:
    """``messages`` with every image placeholder decoded (raises ``ApiError``). Runs on a
    worker thread: decoding is CPU work, a remote fetch is I/O."""
    from engine.vision.image_io import check_count, decode_image

    sources = [p for m in messages if isinstance(m.get("content"), list)
               for p in m["content"] if isinstance(p, dict) and p.get("type") == "image"]
    if not sources:
        return messages
    refuse_without_vision(info, param)
    try:
        check_count(len(sources), policy.limits)
    except ImageError as exc:
        raise bad_request(f"Too many images: {exc}.", param) from None
    decoded = {}
    for p in sources:
        src = p["source"]
        data = _bytes_of(src, policy, param)
        try:
            decoded[id(p)] = decode_image(data, policy.limits)
        except ImageError as exc:
            raise bad_request(f"{src.get('where', 'image')}: {exc}.", param) from None
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "image", "image": decoded[id(p)]}
                       if isinstance(p, dict) and p.get("type") == "image" else p
                       for p in content]
            m = {**m, "content": content}
        out.append(m)
    return out


def _bytes_of(src: dict, policy: ImagePolicy, param: str) -> bytes:
    where = src.get("where", "image")
    if "base64" in src:
        return _b64(src["base64"], where, param, policy.limits.max_bytes)
    url = src.get("url")
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}: the image needs a url (a data: URL or http(s) URL)", param)
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or ";base64" not in head:
            raise bad_request(f"{where}: a data: URL must be base64 "
                              "(data:image/png;base64,...)", param)
        mime = head[5:].split(";")[0].strip().lower()
        if mime and not mime.startswith("image/"):
            raise bad_request(f"{where}: the data: URL holds {mime!r}, not an image", param)
        return _b64(payload, where, param, policy.limits.max_bytes)
    if url.lower().startswith(("http://", "https://")):
        if not policy.allow_remote:
            raise bad_request(f"{where}: remote image URLs are refused (this server does not "
                              "fetch URLs). Send the image inline as a data: URL (base64), or "
                              "start the server with --allow-remote-images.", param)
        return _fetch(url, where, policy.limits.max_bytes, param)
    raise bad_request(f"{where}: unsupported image URL (use a data: URL with base64)", param)


def _b64(text, where: str, param: str, max_bytes: int | None = None) -> bytes:
    if not isinstance(text, str):
        raise bad_request(f"{where}: base64 data must be a string", param)
    if max_bytes is not None and len(text) > (max_bytes + 2) // 3 * 4 + 4:
        mib = 1 << 20
        raise bad_request(f"{where}: the image is over {max_bytes / mib:.0f} MiB, the "
                          "limit per image", param)
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: the image data is not valid base64", param) from None


def _fetch(url: str, where: str, max_bytes: int, param: str) -> bytes:
    """GET ``url`` (only with --allow-remote-images): at most ``max_bytes``, a short timeout."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"User-Agent": "mtpchat-server"})
    try:
        with urllib.request.urlopen(req, timeout=REMOTE_TIMEOUT_S) as resp:  # noqa: S310
            data = resp.read(max_bytes + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise bad_request(f"{where}: the image URL could not be fetched ({exc})", param) \
            from None
    if len(data) > max_bytes:
        raise bad_request(f"{where}: the image is over {max_bytes >> 20} MiB, the limit per "
                          "image", param)
    return data


def openai_part(p: dict, where: str) -> dict | None:
    """An OpenAI content part as an image placeholder (``image_url`` in chat completions,
    ``input_image`` in /v1/responses), else None."""
    kind = p.get("type")
    if kind == "image_url":
        ref = p.get("image_url")
        url = ref.get("url") if isinstance(ref, dict) else ref
        return placeholder({"url": url, "where": where})
    if kind == "input_image":
        ref = p.get("image_url")
        url = ref.get("url") if isinstance(ref, dict) else ref
        if url is None and p.get("file_id") is not None:
            raise bad_request(f"{where}: file_id images are not supported; send image_url "
                              "as a data: URL", "input")
        return placeholder({"url": url, "where": where})
    return None


def anthropic_block(b: dict, where: str) -> dict:
    """An Anthropic ``image`` block as a placeholder (base64 or url source)."""
    src = b.get("source")
    if not isinstance(src, dict):
        raise bad_request(f"{where}: an image block needs a source", "messages")
    if src.get("type") == "base64":
        media = src.get("media_type")
        if not isinstance(media, str) or not media.startswith("image/"):
            raise bad_request(f"{where}: source.media_type must be an image type such as "
                              "image/png", "messages")
        return placeholder({"base64": src.get("data"), "where": where})
    if src.get("type") == "url":
        return placeholder({"url": src.get("url"), "where": where})
    raise bad_request(f"{where}: image source type must be base64 or url", "messages")


__all__ = ["ApiError", "ImagePolicy", "collect", "openai_part", "anthropic_block",
           "has_images", "refuse_without_vision"]
