"""Before Qt starts on Linux's xcb platform: name the missing system libraries and the apt
command, instead of Qt's abort ("could not load the Qt platform plugin xcb") that blames the
wrong library. Nothing here imports Qt widgets; the plugin is only inspected with ``ldd``."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# soname prefix -> Debian package
PACKAGES = {
    "libxcb-cursor": "libxcb-cursor0", "libxcb-icccm": "libxcb-icccm4",
    "libxcb-keysyms": "libxcb-keysyms1", "libxcb-image": "libxcb-image0",
    "libxcb-render-util": "libxcb-render-util0", "libxcb-shape": "libxcb-shape0",
    "libxcb-xkb": "libxcb-xkb1", "libxcb-randr": "libxcb-randr0",
    "libxcb-xinerama": "libxcb-xinerama0", "libX11-xcb": "libx11-xcb1",
    "libxkbcommon-x11": "libxkbcommon-x11-0", "libxkbcommon": "libxkbcommon0",
    "libEGL": "libegl1", "libGL": "libgl1", "libfontconfig": "libfontconfig1",
    "libdbus-1": "libdbus-1-3", "libglib-2.0": "libglib2.0-0", "libgthread-2.0": "libglib2.0-0",
    "libfreetype": "libfreetype6",
}
_NOT_FOUND = re.compile(r"(lib[\w.+-]+\.so(?:\.\d+)*): cannot open shared object file")


def _uses_xcb() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    return platform.startswith("xcb") or (platform == "" and bool(os.environ.get("DISPLAY")))


def missing_libraries() -> list[str]:
    """Sonames the xcb plugin (and Qt's xcb library) need but the system lacks."""
    if not _uses_xcb() or shutil.which("ldd") is None:
        return []
    import PySide6

    qt = Path(PySide6.__file__).parent / "Qt"
    targets = [qt / "plugins" / "platforms" / "libqxcb.so", qt / "lib" / "libQt6XcbQpa.so.6"]
    missing: set[str] = set()
    for t in (t for t in targets if t.exists()):
        try:
            out = subprocess.run(["ldd", str(t)], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        missing.update(line.split()[0] for line in out.splitlines() if "not found" in line)
    return sorted(missing)


def qt_core_missing() -> list[str]:
    """The system library Qt's core cannot load without (on any platform, offscreen too):
    a fresh Debian has no ``libglib-2.0.so.0`` until a desktop package brings it."""
    try:
        import PySide6.QtCore  # noqa: F401
    except ImportError as exc:
        found = _NOT_FOUND.search(str(exc))
        if found is None:
            raise
        return [found.group(1)]
    return []


def advice(missing: list[str], what: str = "Qt's xcb platform plugin") -> str:
    pkgs = sorted({_package(lib) for lib in missing})
    return (f"{what} cannot load: missing {', '.join(missing)}. "
            f"Install them with: sudo apt-get install -y {' '.join(pkgs)}")


def _package(soname: str) -> str:
    stem = soname.split(".so")[0]
    return PACKAGES.get(stem, stem.lower())
