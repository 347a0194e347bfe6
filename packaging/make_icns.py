"""Make the app's ``.icns`` from ``packaging/icon/icon.png`` (1024x1024).

On macOS, Apple's own tools do it (``sips`` resizes into an ``.iconset``, ``iconutil``
packs it). Elsewhere (or with ``--backend qt``) Qt resizes and this module writes the ICNS
container itself: a big-endian ``icns`` header followed by PNG-compressed entries, one per
size, which macOS 10.7+ reads natively.

    python packaging/make_icns.py [--png packaging/icon/icon.png] [--out build/MTPChat.icns]
                                  [--backend auto|iconutil|qt]
"""
from __future__ import annotations

import argparse
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PNG = HERE / "icon" / "icon.png"
DEFAULT_OUT = HERE.parent / "build" / "MTPChat.icns"  # build/ is git-ignored

# (ICNS type, pixel size, iconset file name) -- the full set iconutil produces.
ENTRIES = (
    ("icp4", 16, "icon_16x16.png"),
    ("ic11", 32, "icon_16x16@2x.png"),
    ("icp5", 32, "icon_32x32.png"),
    ("ic12", 64, "icon_32x32@2x.png"),
    ("ic07", 128, "icon_128x128.png"),
    ("ic13", 256, "icon_128x128@2x.png"),
    ("ic08", 256, "icon_256x256.png"),
    ("ic14", 512, "icon_256x256@2x.png"),
    ("ic09", 512, "icon_512x512.png"),
    ("ic10", 1024, "icon_512x512@2x.png"),
)


def _iconutil_available() -> bool:
    return sys.platform == "darwin" and bool(shutil.which("iconutil")) and bool(shutil.which("sips"))


def _build_with_iconutil(png: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        iconset = Path(tmp) / "MTPChat.iconset"
        iconset.mkdir()
        for _type, px, name in ENTRIES:
            subprocess.run(["sips", "-z", str(px), str(px), str(png), "--out", str(iconset / name)],
                           check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["iconutil", "-c", "icns", str(iconset), "-o", str(out)], check=True)


def _png_bytes_qt(png: Path, px: int) -> bytes:
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QImage

    img = QImage(str(png))
    if img.isNull():
        raise ValueError(f"cannot read {png}")
    scaled = img.scaled(px, px, Qt.AspectRatioMode.IgnoreAspectRatio,
                        Qt.TransformationMode.SmoothTransformation)
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not scaled.save(buf, "PNG"):
        raise ValueError(f"cannot encode a {px}px PNG")
    buf.close()
    return bytes(data.data())


def icns_bytes(entries: list[tuple[str, bytes]]) -> bytes:
    """Pack ``(type, png_bytes)`` entries into an ICNS file image."""
    body = b"".join(t.encode("ascii") + struct.pack(">I", len(d) + 8) + d for t, d in entries)
    return b"icns" + struct.pack(">I", len(body) + 8) + body


def read_icns(data: bytes) -> dict[str, bytes]:
    """Parse an ICNS image into ``{type: payload}`` (ValueError if malformed)."""
    if data[:4] != b"icns" or struct.unpack(">I", data[4:8])[0] != len(data):
        raise ValueError("not an ICNS file (bad magic or length)")
    out, pos = {}, 8
    while pos < len(data):
        if pos + 8 > len(data):
            raise ValueError("truncated ICNS entry header")
        kind = data[pos:pos + 4].decode("ascii")
        size = struct.unpack(">I", data[pos + 4:pos + 8])[0]
        if size < 8 or pos + size > len(data):
            raise ValueError(f"corrupt ICNS entry {kind!r}")
        out[kind] = data[pos + 8:pos + size]
        pos += size
    return out


def _build_with_qt(png: Path, out: Path) -> None:
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    out.write_bytes(icns_bytes([(t, _png_bytes_qt(png, px)) for t, px, _n in ENTRIES]))


def build_icns(png: Path = DEFAULT_PNG, out: Path | None = None, *, backend: str = "auto") -> Path:
    """Write ``out`` (default: build/MTPChat.icns) and return its path."""
    png = Path(png)
    out = Path(out) if out else DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    if backend == "iconutil" or (backend == "auto" and _iconutil_available()):
        _build_with_iconutil(png, out)
    elif backend in ("qt", "auto"):
        _build_with_qt(png, out)
    else:
        raise ValueError(f"unknown backend {backend!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--png", type=Path, default=DEFAULT_PNG)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--backend", choices=("auto", "iconutil", "qt"), default="auto")
    args = ap.parse_args(argv)
    out = build_icns(args.png, args.out, backend=args.backend)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
