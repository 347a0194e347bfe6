"""Build-time helpers for ``packaging/mtpchat.spec`` and ``build_macos.sh``.

Pure standard library and no PyInstaller import at module level, so the tests can exercise
every rule here on Linux without building anything. The spec imports this module by path
(``packaging/`` is not a Python package: it would shadow the ``packaging`` distribution).

Also a small command line used by build_macos.sh::

    python packaging/mtpchat_bundle.py version
    python packaging/mtpchat_bundle.py verify  "dist/MTP Chat.app" --mac
    python packaging/mtpchat_bundle.py minos   "dist/MTP Chat.app" --max 14.0
"""
from __future__ import annotations

import argparse
import os
import re
import struct
import sys
import tomllib
from pathlib import Path

APP_NAME = "MTP Chat"
BUNDLE_ID = "app.mtpchat.MTPChat"
MIN_MACOS = "14.0"
LINUX_EXE_NAME = "mtpchat"
METALLIB = "mlx.metallib"

# Never bundled: the app does not use them and they weigh hundreds of MB each. (Pillow, PIL,
# is bundled: images in the chat are decoded with it, engine/vision/image_io.py.)
HEAVY_EXCLUDES = [
    "torch", "torchvision", "torchaudio", "triton", "tensorflow", "tensorboard", "keras",
    "jax", "jaxlib", "flax", "datasets", "pyarrow", "pandas", "scipy", "sklearn",
    "matplotlib", "IPython", "jupyter", "notebook", "pytest", "_pytest", "pytest_qt",
    "sympy", "networkx", "onnx", "onnxruntime", "cv2", "tkinter", "_tkinter",
    "lm_eval", "accelerate", "bitsandbytes", "timm", "torchao",
]
# Qt modules the app does not use (QtCharts, QtSvg, QtOpenGL* stay: the dashboard may chart).
QT_EXCLUDES = [
    f"PySide6.{m}" for m in (
        "QtWebEngineCore", "QtWebEngineWidgets", "QtWebEngineQuick", "QtWebChannel",
        "QtWebSockets", "QtWebView", "QtHttpServer", "Qt3DCore", "Qt3DRender", "Qt3DInput",
        "Qt3DLogic", "Qt3DAnimation", "Qt3DExtras", "QtQml", "QtQuick", "QtQuick3D",
        "QtQuickWidgets", "QtQuickControls2", "QtQuickTest", "QtMultimedia",
        "QtMultimediaWidgets", "QtSpatialAudio", "QtBluetooth", "QtNfc", "QtPositioning",
        "QtLocation", "QtSensors", "QtSerialPort", "QtSerialBus", "QtTextToSpeech", "QtPdf",
        "QtPdfWidgets", "QtDesigner", "QtHelp", "QtUiTools", "QtSql", "QtTest",
        "QtRemoteObjects", "QtScxml", "QtStateMachine", "QtDataVisualization", "QtGraphs",
        "QtGraphsWidgets", "QtNetworkAuth", "QtAxContainer", "QtCanvasPainter",
    )
]
EXCLUDES = HEAVY_EXCLUDES + QT_EXCLUDES
# Top-level names that must not appear in the frozen tree (checked after the build).
FORBIDDEN_IN_BUNDLE = ("torch", "tensorflow", "jax", "jaxlib", "PySide6/Qt/lib/QtWebEngineCore.framework")
FORBIDDEN_LIB_PREFIXES = ("libQt6WebEngine", "libQt6Quick", "libQt6Qml", "libQt63D", "libtorch",
                          "QtWebEngineCore.framework", "QtQuick.framework", "QtQml.framework")
# Modules every frozen build must carry (mlx_lm imports model code by model_type).
# (Extension modules such as mlx.core are not in the PYZ; verify_tree checks those files.)
REQUIRED_MODULES = ("mlx_lm.models.qwen3_5", "mlx_lm.models.qwen3_5_moe", "mlx",
                    "transformers", "tokenizers", "huggingface_hub", "app.main", "engine")


# ------------------------------------------------------------------------------------ version
def read_version(root: Path) -> str:
    """The version in pyproject.toml; it must equal ``engine.__version__`` (ValueError if not)."""
    with open(root / "pyproject.toml", "rb") as fh:
        py_version = tomllib.load(fh)["project"]["version"]
    text = (root / "engine" / "__init__.py").read_text(encoding="utf-8")
    m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.M)
    if not m:
        raise ValueError("engine/__init__.py has no __version__")
    if m.group(1) != py_version:
        raise ValueError(f"version mismatch: pyproject.toml {py_version!r} "
                         f"vs engine.__version__ {m.group(1)!r}")
    return py_version


def info_plist(version: str) -> dict:
    """Info.plist values for the BUNDLE (PyInstaller fills in the executable and icon keys)."""
    return {
        "CFBundleName": APP_NAME,
        "CFBundleDisplayName": APP_NAME,
        "CFBundleIdentifier": BUNDLE_ID,
        "CFBundleShortVersionString": version,
        "CFBundleVersion": version,
        "CFBundlePackageType": "APPL",
        "CFBundleDevelopmentRegion": "en",
        "LSMinimumSystemVersion": MIN_MACOS,
        "LSArchitecturePriority": ["arm64"],
        "LSApplicationCategoryType": "public.app-category.productivity",
        "NSHighResolutionCapable": True,
        "NSPrincipalClass": "NSApplication",
        "NSRequiresAquaSystemAppearance": False,  # follow the system's dark mode
        "NSSupportsAutomaticGraphicsSwitching": True,
        "NSHumanReadableCopyright": "MTP Chat contributors. Apache-2.0.",
        # A chat app opens no documents: no CFBundleDocumentTypes, no UTIs.
    }


# ------------------------------------------------------------------------------- collection
def package_dir(name: str) -> Path:
    """Folder of an installed (possibly namespace) package, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed in this interpreter")
    return Path(list(spec.submodule_search_locations)[0])


def _is_shared_lib(path: Path) -> bool:
    return path.suffix in (".dylib", ".so") or ".so." in path.name


def mlx_native_files(mlx_dir: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(binaries, datas) for the whole ``mlx/lib`` folder plus auditwheel's ``mlx*.libs``.

    Shared libraries go in as binaries (Contents/Frameworks on macOS), everything else
    (``mlx.metallib``) as data (Contents/Resources, cross-linked beside the dylib by
    PyInstaller). CMake package files are skipped: they only serve C++ extension builds.
    """
    binaries: list[tuple[str, str]] = []
    datas: list[tuple[str, str]] = []
    lib_dir = mlx_dir / "lib"
    if not lib_dir.is_dir():
        raise FileNotFoundError(f"{lib_dir} is missing: is mlx (and mlx-metal on macOS) installed?")
    for f in sorted(lib_dir.rglob("*")):
        rel = f.relative_to(lib_dir)
        if f.is_dir() or rel.parts[0] == "cmake":
            continue
        dest = str(Path("mlx/lib") / rel.parent)
        (binaries if _is_shared_lib(f) else datas).append((str(f), dest))
    for libs in sorted(mlx_dir.parent.glob("mlx*.libs")):  # Linux wheels' vendored BLAS etc.
        binaries += [(str(f), libs.name) for f in sorted(libs.iterdir()) if f.is_file()]
    return binaries, datas


def resources_datas(resources: Path) -> list[tuple[str, str]]:
    """Every file of ``resources/`` (icons, the embedded demo model ...) as ``(src, dest_dir)``.

    Lands in ``sys._MEIPASS/resources`` where engine.resources.resources_dir() looks when
    frozen. Python caches, hidden files and unfinished downloads are skipped.
    """
    out: list[tuple[str, str]] = []
    for f in sorted(resources.rglob("*")):
        rel = f.relative_to(resources)
        if not f.is_file() or "__pycache__" in rel.parts or f.suffix == ".pyc":
            continue
        if any(p.startswith(".") for p in rel.parts) or f.name.endswith(".incomplete"):
            continue
        out.append((str(f), str(Path("resources") / rel.parent)))
    return out


def is_libmlx(dest_name: str) -> bool:
    base = os.path.basename(dest_name)
    return base.startswith("libmlx") and base.endswith(".dylib")


def metallib_entries(toc: list[tuple], canonical: str = "mlx/lib/" + METALLIB) -> list[tuple[str, str, str]]:
    """SYMLINK entries putting ``mlx.metallib`` beside every ``libmlx*.dylib`` in a PyInstaller TOC.

    MLX looks for its metallib next to the libmlx it was loaded from (dladdr; symlinks not
    resolved). On macOS PyInstaller adds a top-level ``libmlx.dylib`` symlink and rewrites
    ``mlx.core`` to load it through ``@rpath``, so dyld may report the library at the top
    level, where no metallib sits. Each such place gets a relative symlink to the one real
    metallib (``canonical``, which must already be in the TOC) instead of a 147 MB copy.
    """
    dests = {e[0] for e in toc}
    if canonical not in dests:
        raise ValueError(f"{canonical} is not collected; cannot link a metallib to it")
    have = {os.path.dirname(d) for d in dests if os.path.basename(d) == METALLIB}
    new: list[tuple[str, str, str]] = []
    for entry in toc:
        if is_libmlx(entry[0]):
            folder = os.path.dirname(entry[0])
            if folder not in have:
                have.add(folder)
                target = os.path.relpath(canonical, folder or ".")
                new.append((os.path.join(folder, METALLIB), target, "SYMLINK"))
    return new


_UNUSED_QT = re.compile(r"(^|/)(lib)?Qt6?(Pdf|Qml|Quick|VirtualKeyboard|WebEngine|3D)[A-Za-z0-9]*"
                        r"(\.framework(/|$)|\.so|\.dylib)")
_UNUSED_QT_PLUGINS = ("libqpdf", "libqtvirtualkeyboardplugin")


def prune_toc(toc: list[tuple]) -> list[tuple]:
    """Drop what PyInstaller's Qt hooks drag in but the app never uses.

    The image-format plugin for PDF pulls in QtPdf, the virtual-keyboard input plugin pulls
    in QtQuick/QtQml (~25 MB); metadata of excluded packages (torch-*.dist-info, copied by
    the transformers hook) would only make ``importlib.metadata`` report them as installed.
    """
    excluded_dists = {m.lower() for m in HEAVY_EXCLUDES}
    kept = []
    for entry in toc:
        dest = entry[0].replace(os.sep, "/")
        base = os.path.basename(dest)
        if "/plugins/" in dest and base.startswith(_UNUSED_QT_PLUGINS):
            continue
        if _UNUSED_QT.search(dest):
            continue
        first = dest.split("/", 1)[0]
        if first.endswith(".dist-info") and first.split("-", 1)[0].lower() in excluded_dists:
            continue
        kept.append(entry)
    return kept


# ------------------------------------------------------------------------------ verification
def verify_tree(root: Path, *, mac: bool) -> list[str]:
    """Problems found in a frozen one-dir tree or .app (empty list: fine)."""
    problems: list[str] = []
    libs = [p for p in root.rglob("libmlx*") if p.name.endswith((".dylib", ".so"))]
    if not libs:
        problems.append(f"no libmlx shared library under {root}")
    if not any(root.rglob("mlx/core.*.so")):
        problems.append("the mlx.core extension module (mlx/core.*.so) is missing")
    if mac:
        for lib in libs:  # every copy or symlink MLX could be loaded through
            if not (lib.parent / METALLIB).exists():
                problems.append(f"{lib.relative_to(root)} has no {METALLIB} beside it")
    elif not any(root.rglob("mlx_cpu.libs")):
        problems.append("mlx_cpu.libs (MLX's vendored BLAS/LAPACK) is missing")
    for name in ("mlx_lm/models/qwen3_5.py", "mlx_lm/models/qwen3_5_moe.py"):
        if not any(root.rglob(name)):
            problems.append(f"{name} missing (mlx_lm must be collected with its sources)")
    if not any(p.is_dir() for p in root.rglob("resources")):
        problems.append("resources/ folder missing")
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if any(rel == f or rel.endswith("/" + f) for f in FORBIDDEN_IN_BUNDLE) and p.is_dir():
            problems.append(f"excluded package was bundled: {rel}")
        if p.name.startswith(FORBIDDEN_LIB_PREFIXES):
            problems.append(f"excluded library was bundled: {rel}")
    return sorted(set(problems))


def missing_modules(pyz_names: set[str], required: tuple[str, ...] = REQUIRED_MODULES) -> list[str]:
    return [m for m in required if m not in pyz_names]


# ------------------------------------------------------------------------ Mach-O minimum OS
_LC_BUILD_VERSION, _LC_VERSION_MIN_MACOSX = 0x32, 0x24
_FAT_MAGICS = (0xCAFEBABE, 0xCAFEBABF)
_CPU_ARM64 = 0x0100000C


def _decode_version(v: int) -> tuple[int, int]:
    return (v >> 16, (v >> 8) & 0xFF)


def _thin_minos(data: bytes, off: int) -> tuple[int, int] | None:
    magic = struct.unpack_from("<I", data, off)[0]
    if magic not in (0xFEEDFACF, 0xFEEDFACE):
        return None
    ncmds = struct.unpack_from("<I", data, off + 16)[0]
    pos = off + (32 if magic == 0xFEEDFACF else 28)
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, pos)
        if cmd in (_LC_BUILD_VERSION, _LC_VERSION_MIN_MACOSX):
            field = pos + (12 if cmd == _LC_BUILD_VERSION else 8)
            return _decode_version(struct.unpack_from("<I", data, field)[0])
        pos += size
    return None


def macho_min_os(path: Path) -> tuple[int, int] | None:
    """Minimum macOS version of a Mach-O file (the arm64 slice of a fat file); None if not Mach-O."""
    with open(path, "rb") as fh:
        head = fh.read(4)
        if len(head) < 4:
            return None
        fh.seek(0)
        if struct.unpack(">I", head)[0] in _FAT_MAGICS:
            data = fh.read()
            nfat = struct.unpack_from(">I", data, 4)[0]
            entry = 20 if struct.unpack(">I", head)[0] == 0xCAFEBABE else 32
            for i in range(nfat):
                cpu, _sub, offset = struct.unpack_from(">iiI" if entry == 20 else ">iiQ", data, 8 + i * entry)[:3]
                if cpu == _CPU_ARM64:
                    return _thin_minos(data, offset)
            return None
        if struct.unpack("<I", head)[0] not in (0xFEEDFACF, 0xFEEDFACE):
            return None
        return _thin_minos(fh.read(), 0)


def too_new_binaries(root: Path, max_os: tuple[int, int]) -> list[str]:
    """Mach-O files under ``root`` that need a newer macOS than ``max_os`` (real files only)."""
    bad = []
    for p in sorted(root.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        minos = macho_min_os(p)
        if minos and minos > max_os:
            bad.append(f"{p.relative_to(root)} needs macOS {minos[0]}.{minos[1]}")
    return bad


# ---------------------------------------------------------------------------------- the CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="MTP Chat packaging helpers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version", help="print the project version (pyproject == engine)")
    v = sub.add_parser("verify", help="check a frozen tree / .app; exit 1 on problems")
    v.add_argument("path", type=Path)
    v.add_argument("--mac", action="store_true", help="apply the macOS (metallib) rules")
    m = sub.add_parser("minos", help="list Mach-O files needing a newer macOS than --max")
    m.add_argument("path", type=Path)
    m.add_argument("--max", default=MIN_MACOS)
    args = ap.parse_args(argv)
    if args.cmd == "version":
        print(read_version(Path(__file__).resolve().parent.parent))
        return 0
    if args.cmd == "verify":
        problems = verify_tree(args.path, mac=args.mac)
    else:
        major, minor = (int(x) for x in args.max.split(".")[:2])
        problems = too_new_binaries(args.path, (major, minor))
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print(f"{args.cmd}: {len(problems)} problem(s) in {args.path}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
