"""Image bytes -> one RGB pixel array, with limits, shared by the app, the server and the engine.

Every image a user pastes, drops or sends over HTTP goes through ``decode_image`` once: it is
the only place that reads untrusted image bytes, so its promise is that bad input ends in one
``ImageError`` line (never a traceback, never a hang, never gigabytes of memory):

- size first: the byte count before anything is parsed, the pixel count from the header
  before a pixel is decoded (a 50 KB PNG can claim 400 megapixels);
- only the formats a chat needs are opened (Pillow can open EPS through Ghostscript and many
  legacy formats; none of them reach it from here);
- every result is the same thing: (H, W, 3) uint8 RGB, EXIF rotation applied, alpha composited
  on white, CMYK and 16-bit samples converted to 8-bit RGB, the first frame of an animation.

Pillow is the decoder (not Qt: ``engine/`` never imports Qt). The digest (sha256 over the shape
and the pixels) identifies an image independently of its file format, so that the same picture
pasted twice hits the same cache entry.
"""
from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from PIL import Image, ImageOps

MiB = 1024 * 1024

# Pillow plugin ids this module opens. HEIF is there only when pillow-heif registered it.
FORMATS = ("PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF", "AVIF", "HEIF")
# ISO-BMFF brands of HEIC/HEIF files (AVIF has its own brands and its own Pillow plugin).
HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs",
               b"mif1", b"msf1"}


class ImageError(ValueError):
    """An image that cannot be used; the message is one line a user can act on."""


@dataclass(frozen=True)
class ImageLimits:
    """What one request may carry. Pixels are counted after decoding (width x height)."""

    max_bytes: int = 20 * MiB
    max_pixels: int = 40_000_000
    max_images: int = 8


DEFAULT_LIMITS = ImageLimits()


@dataclass(frozen=True)
class DecodedImage:
    """One decoded image: ``pixels`` is (H, W, 3) uint8 RGB (read-only); ``digest`` is a
    sha256 hex string over the shape and the pixels."""

    pixels: np.ndarray = field(repr=False)
    digest: str

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    def __repr__(self) -> str:
        return f"DecodedImage({self.width}x{self.height}, {self.digest[:12]})"


def pixel_digest(pixels: np.ndarray) -> str:
    h = hashlib.sha256(("%dx%dx%d;" % pixels.shape).encode())
    h.update(np.ascontiguousarray(pixels).tobytes())
    return h.hexdigest()


def from_pixels(pixels: np.ndarray) -> DecodedImage:
    """Wrap an (H, W, 3) uint8 array already in memory (tests, generated images)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ImageError(f"pixels must be (H, W, 3) uint8, got {pixels.shape} {pixels.dtype}")
    pixels = np.array(pixels, copy=True)
    pixels.setflags(write=False)
    return DecodedImage(pixels=pixels, digest=pixel_digest(pixels))


def check_count(count: int, limits: ImageLimits | None = None) -> None:
    limits = limits or DEFAULT_LIMITS
    if count > limits.max_images:
        raise ImageError(f"{count} images in one request; the limit is {limits.max_images}")


def decode_images(datas: Sequence[bytes], limits: ImageLimits | None = None
                  ) -> list[DecodedImage]:
    """Decode several images of one request; the count is checked before any is decoded."""
    check_count(len(datas), limits)
    return [decode_image(d, limits) for d in datas]


def decode_image(data: bytes, limits: ImageLimits | None = None) -> DecodedImage:
    """Decode ``data`` (the bytes of an image file) to RGB pixels, or raise ``ImageError``."""
    limits = limits or DEFAULT_LIMITS
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f"an image must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageError(f"the image is {len(data) / MiB:.1f} MiB; the limit is "
                         f"{limits.max_bytes / MiB:.0f} MiB")
    refuse_unsupported(data)
    img = open_checked(data, limits)
    try:
        rgb = to_rgb(img)
    except ImageError:
        raise
    except MemoryError:
        raise ImageError("not enough memory to decode the image") from None
    except Exception as e:  # noqa: BLE001 -- Pillow raises many types on malformed input
        raise ImageError(f"the image is damaged or truncated ({one_line(e)})") from None
    pixels = np.asarray(rgb, dtype=np.uint8)
    pixels = np.ascontiguousarray(pixels.reshape(rgb.height, rgb.width, 3))
    pixels.setflags(write=False)
    return DecodedImage(pixels=pixels, digest=pixel_digest(pixels))


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:160]


def refuse_unsupported(data: bytes) -> None:
    """Formats recognised only to be refused with a useful line: SVG (vector, needs a
    renderer), and HEIC when no HEIF reader is installed."""
    head = data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in data[:4096].lower()):
        raise ImageError("SVG is not supported; export it as PNG")
    if data[4:8] == b"ftyp" and data[8:12] in HEIF_BRANDS and not heif_available():
        raise ImageError("HEIC images need a HEIF reader (pip install pillow-heif); "
                         "export it as JPEG or PNG")


def heif_available() -> bool:
    """Register pillow-heif's opener if it is installed (an optional dependency)."""
    if "HEIF" in Image.OPEN:
        return True
    try:
        from pillow_heif import register_heif_opener  # type: ignore[import-not-found]
    except ImportError:
        return False
    register_heif_opener()
    return "HEIF" in Image.OPEN


def open_checked(data: bytes, limits: ImageLimits) -> Image.Image:
    """Open (header only) and check the pixel count before anything is decoded."""
    Image.init()
    formats = [f for f in FORMATS if f in Image.OPEN]
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb check (a global, 89 MP) warns; ours below is the one that counts.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=formats)
    except Image.DecompressionBombError:
        raise ImageError(f"the image is too large to decode; the limit is "
                         f"{megapixels(limits.max_pixels)} megapixels") from None
    except Image.UnidentifiedImageError:
        raise ImageError("not an image this app can read (PNG, JPEG, WebP, GIF, BMP, TIFF, "
                         "AVIF)") from None
    except Exception as e:  # noqa: BLE001 -- malformed headers raise many types
        raise ImageError(f"the image is damaged ({one_line(e)})") from None
    width, height = img.size
    if width <= 0 or height <= 0:
        raise ImageError(f"the image has no pixels ({width}x{height})")
    if width * height > limits.max_pixels:
        raise ImageError(f"the image is {width}x{height} ({megapixels(width * height)} "
                         f"megapixels); the limit is {megapixels(limits.max_pixels)} megapixels")
    return img


def megapixels(pixels: int) -> str:
    return f"{pixels / 1e6:.3g}"


def to_rgb(img: Image.Image) -> Image.Image:
    """Decode the first frame and bring it to 8-bit RGB, upright, alpha on white."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        img.seek(0)
        img.load()
        img = upright(img)
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit grey: Pillow's convert() clips at 255 instead of scaling; scale here.
        wide = np.asarray(img, dtype=np.int64).reshape(img.height, img.width)
        img = Image.fromarray((np.clip(wide, 0, 65535) >> 8).astype(np.uint8), mode="L")
    elif img.mode == "F":
        flat = np.asarray(img, dtype=np.float64).reshape(img.height, img.width)
        img = Image.fromarray(np.clip(flat, 0, 255).astype(np.uint8), mode="L")
    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info
    if has_alpha:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def upright(img: Image.Image) -> Image.Image:
    """Apply the EXIF orientation (phone photos); a broken EXIF block leaves the image as is."""
    try:
        return ImageOps.exif_transpose(img)
    except Exception:  # noqa: BLE001 -- EXIF is metadata; bad metadata must not lose the image
        return img
