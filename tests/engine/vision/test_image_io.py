"""decode_image on real files of each kind, written here with Pillow/numpy (or by hand where
Pillow cannot write the kind: 16-bit RGB PNG, a PNG header claiming 400 megapixels)."""
from __future__ import annotations

import dataclasses
import io
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from engine.vision.image_io import (DEFAULT_LIMITS, DecodedImage, ImageError, ImageLimits,
                                    check_count, decode_image, decode_images, from_pixels,
                                    heif_available)


def save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def png_by_hand(width: int, height: int, *, bit_depth: int, color_type: int,
                raw: bytes | None) -> bytes:
    """A PNG written chunk by chunk; ``raw`` None writes a header with no pixel data."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    if raw is not None:
        out += chunk(b"IDAT", zlib.compress(raw))
    return out + chunk(b"IEND", b"")


def gradient(h: int = 24, w: int = 32) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 7 % 256, y * 11 % 256, (x + y) * 5 % 256], -1).astype(np.uint8)


def assert_one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert msg and "\n" not in msg and len(msg) < 200, msg
    return msg


# --- correct results -------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,kw", [("PNG", {}), ("BMP", {}), ("WEBP", {"lossless": True}),
                                    ("TIFF", {})])
def test_lossless_formats_give_the_exact_pixels(fmt, kw):
    px = gradient()
    out = decode_image(save(Image.fromarray(px), fmt, **kw))
    assert isinstance(out, DecodedImage)
    assert out.pixels.dtype == np.uint8 and out.pixels.shape == (24, 32, 3)
    assert (out.width, out.height) == (32, 24)
    np.testing.assert_array_equal(out.pixels, px)


def test_digest_depends_on_pixels_and_shape_not_on_the_file_format():
    px = gradient()
    png = decode_image(save(Image.fromarray(px), "PNG"))
    bmp = decode_image(save(Image.fromarray(px), "BMP"))
    assert png.digest == bmp.digest == from_pixels(px).digest
    other = px.copy()
    other[0, 0, 0] ^= 1
    assert from_pixels(other).digest != png.digest
    # same bytes, other shape
    flat = px.reshape(-1)
    assert from_pixels(flat.reshape(32, 24, 3)).digest != png.digest


def test_result_is_frozen_and_read_only():
    out = decode_image(save(Image.fromarray(gradient()), "PNG"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.digest = "x"  # type: ignore[misc]
    with pytest.raises(ValueError):
        out.pixels[0, 0, 0] = 1


def test_one_by_one_png():
    out = decode_image(save(Image.new("RGB", (1, 1), (10, 200, 30)), "PNG"))
    assert out.pixels.shape == (1, 1, 3)
    assert out.pixels[0, 0].tolist() == [10, 200, 30]


def test_jpeg_is_close_to_its_source():
    px = np.zeros((64, 64, 3), np.uint8)
    px[:, :32] = (200, 40, 40)
    px[:, 32:] = (30, 60, 220)
    out = decode_image(save(Image.fromarray(px), "JPEG", quality=95))
    assert np.abs(out.pixels.astype(int) - px).mean() < 3


def test_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (16, 16), c) for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    data = save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 3
    out = decode_image(data)
    assert out.pixels.shape == (16, 16, 3)
    assert (out.pixels == [255, 0, 0]).all()


def test_cmyk_jpeg_is_converted_to_rgb():
    rgb = Image.new("RGB", (32, 32), (255, 0, 0))
    cmyk = rgb.convert("CMYK")
    data = save(cmyk, "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    out = decode_image(data)
    assert np.abs(out.pixels.astype(int) - [255, 0, 0]).max() <= 3


def test_sixteen_bit_grey_png_is_scaled_not_clipped():
    grey = np.array([[0, 256, 32768, 65535]], dtype=np.uint16)
    data = save(Image.fromarray(grey), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    out = decode_image(data)
    assert out.pixels.shape == (1, 4, 3)
    assert out.pixels[0, :, 0].tolist() == [0, 1, 128, 255]
    assert (out.pixels[..., 0] == out.pixels[..., 2]).all()


def test_sixteen_bit_rgb_png_keeps_the_high_byte():
    # Two pixels per row, 16 bits per sample, big-endian: (0x1234, 0xFF00, 0x8000), (0, 0, 0xFFFF)
    row = b"\x00" + struct.pack(">6H", 0x1234, 0xFF00, 0x8000, 0, 0, 0xFFFF)
    data = png_by_hand(2, 1, bit_depth=16, color_type=2, raw=row)
    out = decode_image(data)
    assert out.pixels.tolist() == [[[0x12, 0xFF, 0x80], [0, 0, 0xFF]]]


def test_alpha_is_composited_on_white():
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[0, 0] = (255, 0, 0, 255)    # opaque red
    rgba[0, 1] = (255, 0, 0, 0)      # fully transparent: white
    rgba[1, 0] = (0, 0, 0, 128)      # half black: mid grey
    rgba[1, 1] = (0, 0, 255, 255)
    out = decode_image(save(Image.fromarray(rgba, "RGBA"), "PNG"))
    assert out.pixels[0, 0].tolist() == [255, 0, 0]
    assert out.pixels[0, 1].tolist() == [255, 255, 255]
    assert all(abs(v - 127) <= 1 for v in out.pixels[1, 0].tolist())
    assert out.pixels[1, 1].tolist() == [0, 0, 255]


def test_palette_png_with_a_transparent_index():
    pal = Image.new("P", (4, 1))
    pal.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * (256 * 3 - 9))
    pal.putdata([0, 1, 2, 1])
    data = save(pal, "PNG", transparency=0)
    out = decode_image(data)
    assert out.pixels[0].tolist() == [[255, 255, 255], [255, 0, 0], [0, 255, 0], [255, 0, 0]]


def test_grey_with_alpha_png():
    la = Image.fromarray(np.array([[[0, 255], [0, 0]]], np.uint8), "LA")
    out = decode_image(save(la, "PNG"))
    assert out.pixels[0].tolist() == [[0, 0, 0], [255, 255, 255]]


def test_exif_rotation_is_applied():
    # Stored 64 wide x 32 high, left half red; orientation 6 means "rotate 90 degrees clockwise
    # to display", so the displayed image is 32 wide x 64 high with red on top.
    px = np.zeros((32, 64, 3), np.uint8)
    px[:, :32] = (255, 0, 0)
    px[:, 32:] = (0, 0, 255)
    img = Image.fromarray(px)
    exif = img.getexif()
    exif[0x0112] = 6
    out = decode_image(save(img, "JPEG", quality=95, exif=exif.tobytes()))
    assert (out.width, out.height) == (32, 64)
    top, bottom = out.pixels[:28].astype(int), out.pixels[36:].astype(int)
    assert np.abs(top - [255, 0, 0]).mean() < 10
    assert np.abs(bottom - [0, 0, 255]).mean() < 10


# --- refused, in one line --------------------------------------------------------------------

def test_bomb_header_is_refused_before_any_pixel_is_decoded():
    # 20000 x 20000 RGB would be 1.2 GB decoded; the file is a few dozen bytes and carries no
    # pixel data at all, so only a check of the header can answer before decoding.
    data = png_by_hand(20000, 20000, bit_depth=8, color_type=2, raw=None)
    assert len(data) < 100
    with pytest.raises(ImageError) as err:
        decode_image(data)
    assert "megapixels" in assert_one_line(err)
    assert Image.MAX_IMAGE_PIXELS == 89_478_485  # Pillow's global is left alone


def test_real_twenty_thousand_square_image_is_refused_quickly():
    # A real 20000 x 20000 1-bit PNG (its pixel data compresses to a few hundred KB).
    data = save(Image.new("1", (20000, 20000)), "PNG")
    t0 = time.perf_counter()
    with pytest.raises(ImageError) as err:
        decode_image(data)
    assert "megapixels" in assert_one_line(err)
    assert time.perf_counter() - t0 < 30  # not a speed test: a guard against a full decode


def test_our_limit_applies_below_pillows_own():
    # 8000 x 6000 = 48 MP: under Pillow's 89 MP warning, over the 40 MP default
    data = png_by_hand(8000, 6000, bit_depth=8, color_type=0, raw=None)
    with pytest.raises(ImageError) as err:
        decode_image(data)
    msg = assert_one_line(err)
    assert "8000x6000" in msg and "40 megapixels" in msg
    small = ImageLimits(max_pixels=100)
    with pytest.raises(ImageError, match="11x10 .* the limit is 0.0001 megapixels"):
        decode_image(save(Image.new("RGB", (11, 10)), "PNG"), small)
    assert decode_image(save(Image.new("RGB", (10, 10)), "PNG"), small).width == 10


def test_byte_limit():
    data = save(Image.fromarray(gradient()), "PNG")
    with pytest.raises(ImageError) as err:
        decode_image(data, ImageLimits(max_bytes=len(data) - 1))
    assert "MiB" in assert_one_line(err)
    assert DEFAULT_LIMITS.max_bytes == 20 * 1024 * 1024 and DEFAULT_LIMITS.max_images == 8


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_truncated_files(fmt):
    data = save(Image.fromarray(gradient(64, 64)), fmt)
    with pytest.raises(ImageError) as err:
        decode_image(data[: len(data) // 2])
    assert_one_line(err)


def test_corrupt_pixel_data():
    data = bytearray(save(Image.fromarray(gradient(64, 64)), "PNG"))
    data[60:200] = b"\x55" * 140  # inside IDAT: zlib stream broken
    with pytest.raises(ImageError) as err:
        decode_image(bytes(data))
    assert_one_line(err)


@pytest.mark.parametrize("data", [b"hello, this is a text file\n", bytes(range(256)) * 8,
                                  b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n",
                                  b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"])
def test_not_an_image(data):
    with pytest.raises(ImageError) as err:
        decode_image(data)
    assert "not an image" in assert_one_line(err)


@pytest.mark.parametrize("data", [
    b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>',
    b'\xef\xbb\xbf<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"></svg>'])
def test_svg_is_refused(data):
    with pytest.raises(ImageError) as err:
        decode_image(data)
    assert assert_one_line(err) == "SVG is not supported; export it as PNG"


def test_heic_without_a_reader_says_so():
    data = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 64
    with pytest.raises(ImageError) as err:
        decode_image(data)
    msg = assert_one_line(err)
    if not heif_available():
        assert "HEIC" in msg


def test_empty_and_wrong_type():
    with pytest.raises(ImageError, match="empty"):
        decode_image(b"")
    with pytest.raises(ImageError, match="bytes"):
        decode_image("a.png")  # type: ignore[arg-type]


def test_image_count_limit():
    one = save(Image.new("RGB", (2, 2)), "PNG")
    assert len(decode_images([one] * 8)) == 8
    with pytest.raises(ImageError, match="9 images"):
        decode_images([one] * 9)
    check_count(2, ImageLimits(max_images=2))
    with pytest.raises(ImageError):
        check_count(3, ImageLimits(max_images=2))
