"""Images attached to a message (issue 32): reading them, what the model gets, exports (no Qt).

An image attachment is an ``app.db.Attachment`` of kind "image" whose ``data`` is the file's
bytes as given (PNG, JPEG, WebP, GIF...: saved with the chat and exported as they came).
Every image is decoded once when attached (``engine.vision.image_io.decode_image``, with its
limits), so a file that cannot be used is refused then, in one line, and never reaches a
conversation; the pixels are decoded again from the stored bytes when a prompt is built.

``user_content(text, files, vision=)`` is a user turn as the engine takes it: with images and a
model that reads them, a list of parts, the images first, then the text (with any text files
inlined as ``with_attachments`` does); without images, the plain string as before. For a model
without a vision encoder the images become a one-line note in the text, so a chat that has
images can go on with a text model.
"""
from __future__ import annotations

import base64
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from app.chat.attachments import AttachmentError, with_attachments
from app.db import Attachment
from engine.vision.image_io import DEFAULT_LIMITS, DecodedImage, ImageError, decode_image

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".jpe", ".jfif", ".webp", ".gif", ".bmp", ".tif",
                  ".tiff", ".avif", ".heic", ".heif", ".svg", ".svgz"}
IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp *.tif *.tiff *.avif *.heic *.heif)"
PASTED_NAME = "Pasted image.png"
# First bytes -> MIME type, for exports (data: URIs) and the full-size viewer's title.
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"), (b"BM", "image/bmp"),
          (b"II*\x00", "image/tiff"), (b"MM\x00*", "image/tiff"))


def is_image_path(path: str | Path) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def model_reads_images(info) -> bool:
    """``ModelInfo.vision`` (the engine sets it when it loaded a vision encoder); False for
    a model that predates the field or when none is loaded."""
    return bool(getattr(info, "vision", False))


def no_vision_message(model_name: str | None) -> str:
    who = model_name or "This model"
    return (f"{who} cannot read images (it has no vision encoder); load a vision model "
            "to send images.")


def image_attachment(name: str, data: bytes) -> Attachment:
    """An image attachment of ``data``, checked by decoding it; ``AttachmentError`` (one line,
    naming the file) when it cannot be used."""
    try:
        decoded(bytes(data))
    except ImageError as exc:
        raise AttachmentError(f"{name}: {exc}") from None
    return Attachment(name, "", "image", bytes(data))


def read_image(path: str | Path) -> Attachment:
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > DEFAULT_LIMITS.max_bytes:
            raise AttachmentError(f"{p.name}: the image is {size / 2**20:.1f} MiB; the limit is "
                                  f"{DEFAULT_LIMITS.max_bytes / 2**20:.0f} MiB")
        data = p.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"{p.name} cannot be read: {exc.strerror or exc}.") from None
    return image_attachment(p.name, data)


_decoded: OrderedDict[str, DecodedImage] = OrderedDict()
CACHE_PIXEL_BYTES = 256 * 2**20  # decoded images kept (a 40 MP image alone is 120 MB)


def decoded(data: bytes) -> DecodedImage:
    """The pixels of stored image bytes. Recent ones are kept (bounded by their size): a
    chat's images are decoded when attached, then for every reply and thumbnail."""
    key = hashlib.sha256(data).hexdigest()
    image = _decoded.get(key)
    if image is not None:
        _decoded.move_to_end(key)
        return image
    image = decode_image(data)
    _decoded[key] = image
    while len(_decoded) > 1 and sum(i.pixels.nbytes for i in _decoded.values()) > CACHE_PIXEL_BYTES:
        _decoded.popitem(last=False)
    return image


def images_of(files: Sequence[Attachment]) -> list[Attachment]:
    return [a for a in files if a.kind == "image"]


def user_content(text: str, files: Sequence[Attachment], *, vision: bool) -> str | list[dict]:
    """A user turn's ``content``: parts (images first) when it has images and the model reads
    them; otherwise text (images named in a note when the model cannot read them)."""
    images = images_of(files)
    body = with_attachments(text, [a for a in files if a.kind != "image"])
    if not images:
        return body
    if not vision:
        names = ", ".join(a.name for a in images)
        return f"[{len(images)} image(s) not shown to this model: {names}]\n\n{body}"
    parts: list[dict] = []
    for a in images:
        try:
            parts.append({"type": "image", "image": decoded(a.data)})
        except ImageError as exc:  # stored bytes damaged on disk: say so, keep the turn
            body = f"[image {a.name} could not be read: {exc}]\n\n{body}"
    if not parts:
        return body
    return parts + [{"type": "text", "text": body}]


_thumbs: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()


def thumbnail(data: bytes, box: int) -> np.ndarray:
    """(h, w, 3) uint8 pixels of the image scaled to fit ``box`` x ``box`` (never enlarged);
    the last 64 are kept (a conversation's view is rebuilt often)."""
    from PIL import Image

    image = decoded(data)
    key = (image.digest, int(box))
    if key in _thumbs:
        _thumbs.move_to_end(key)
        return _thumbs[key]
    img = Image.fromarray(np.asarray(image.pixels))
    img.thumbnail((box, box), Image.Resampling.LANCZOS)
    out = np.ascontiguousarray(np.asarray(img.convert("RGB"), dtype=np.uint8))
    out.setflags(write=False)
    _thumbs[key] = out
    if len(_thumbs) > 64:
        _thumbs.popitem(last=False)
    return out


def mime_type(data: bytes) -> str:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[4:8] == b"ftyp":
        return "image/avif" if data[8:12] in (b"avif", b"avis") else "image/heic"
    return "application/octet-stream"


def data_uri(data: bytes) -> str:
    return f"data:{mime_type(data)};base64,{base64.b64encode(data).decode('ascii')}"


def describe(a: Attachment) -> str:
    """"name (1280x800)" for tooltips and exports."""
    try:
        image = decoded(a.data)
    except ImageError:
        return a.name
    return f"{a.name} ({image.width}x{image.height})"
