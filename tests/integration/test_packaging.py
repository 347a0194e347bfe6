"""Packaging: build_macos.sh's interface and platform guard, the spec's rules, the icon, and
(slow) the Linux one-dir build of the same spec with the frozen app's self-test."""
from __future__ import annotations

import ast
import importlib.util
import os
import plistlib
import shutil
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import engine

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
SPEC = PACKAGING / "mtpchat.spec"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, PACKAGING / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mb = _load("mtpchat_bundle")


def _bash(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------- build_macos.sh
def test_build_macos_help_explains_every_option():
    out = _bash("build_macos.sh", "--help")
    assert out.returncode == 0, out.stderr
    for word in ("--sign", "--notarize", "--dmg", "--dry-run", "--python", "--out",
                 "macosx_14_0_arm64", "codesign --verify --deep --strict", "--self-test",
                 "notarytool", "stapler", "spctl", "hdiutil", "UDZO", "ditto -c -k --keepParent",
                 "--options=runtime", "entitlements", "mlx.metallib", "smoke_linux.sh"):
        assert word in out.stdout, word


@pytest.mark.skipif(sys.platform == "darwin", reason="the guard is for non-Mac machines")
@pytest.mark.parametrize("args", [(), ("--dry-run",), ("--dry-run", "--dmg", "--sign", "X")])
def test_build_macos_stops_at_the_platform_check_off_mac(args):
    out = _bash("build_macos.sh", *args)
    assert out.returncode != 0
    assert "must run on an Apple Silicon Mac (arm64, macOS 14+)" in out.stderr
    assert f"this is {os.uname().sysname} {os.uname().machine}" in out.stderr
    assert "packaging/smoke_linux.sh" in out.stderr
    assert "+ " not in out.stdout  # no step was printed, let alone run
    assert not (ROOT / "build" / "macos" / "venv").exists()


def _fake_mac(tmp_path: Path, *, python_info: str = "3.12 arm64 11.0 ok",
              translated: str = "0", macos: str = "14.5") -> tuple[dict, Path, Path]:
    """A PATH where uname/sw_vers/sysctl say "Apple Silicon Mac" and every Apple tool only
    records that it was called (a dry run must call none of them)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    calls = tmp_path / "calls.log"
    scripts = {
        "uname": 'case "$1" in -s) echo Darwin ;; -m) echo arm64 ;; *) echo Darwin ;; esac',
        "sw_vers": f"echo {macos}",
        "sysctl": f"echo {translated}",
        "python3.12": f'if [ "$1" = -c ]; then echo "{python_info}"; else exec "{sys.executable}" "$@"; fi',
    }
    for tool in ("codesign", "ditto", "hdiutil", "iconutil", "sips", "xcrun", "plutil", "lipo", "spctl"):
        scripts[tool] = f'echo "{tool} $*" >> "{calls}"'
    for name, body in scripts.items():
        (fake / name).write_text("#!/bin/bash\n" + body + "\n")
        (fake / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    return env, fake / "python3.12", calls


def _build_macos(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "build_macos.sh", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)


def test_build_macos_dry_run_on_a_mac_prints_every_step_and_runs_none(tmp_path):
    env, py, calls = _fake_mac(tmp_path)
    out = _build_macos(env, "--dry-run", "--python", str(py), "--dmg", "--out", str(tmp_path / "dist"),
                       "--sign", "Developer ID Application: T (X)", "--notarize", "prof")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    order = ["1. platform check", "platform: macOS 14.5 arm64", "pip download",
             "--platform macosx_14_0_arm64", "--require-hashes", "pip install", "--no-index",
             "pip check", "make_icns.py", "PyInstaller", "packaging/mtpchat.spec",
             "check: metallib beside every libmlx", "check: codesign --verify --deep --strict",
             "--self-test", "check: notarytool submit", "xcrun stapler staple", "spctl -a -vvv -t exec",
             "(helper notarize:)", "xcrun notarytool submit", "check: hdiutil create -format UDZO",
             "hdiutil create", "codesign --force --sign", "hdiutil verify",
             "+ ditto -c -k --keepParent", "dry run done"]
    positions = [text.find(piece) for piece in order]
    assert -1 not in positions, [p for p, i in zip(order, positions) if i == -1]
    assert positions == sorted(positions)
    assert f"MTP-Chat-{engine.__version__}-macos-arm64.zip" in text
    assert not calls.exists(), calls.read_text()          # no Apple tool was run
    assert not (ROOT / "build" / "macos" / "venv").exists()
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"python_info": "3.10 arm64 11.0 ok"}, "needs Python 3.11 or 3.12"),
    ({"python_info": "3.12 x86_64 11.0 ok"}, "must run natively as arm64"),
    ({"python_info": "3.12 arm64 15.0 too-new"}, "use the python.org installer"),
    ({"translated": "1"}, "under Rosetta"),
    ({"macos": "13.6"}, "too old"),
])
def test_build_macos_platform_check_on_a_mac(tmp_path, kwargs, message):
    env, py, calls = _fake_mac(tmp_path, **kwargs)
    out = _build_macos(env, "--dry-run", "--python", str(py))
    assert out.returncode != 0
    assert message in out.stderr
    assert "pip download" not in out.stdout and not calls.exists()


def test_build_macos_rejects_bad_usage():
    assert _bash("build_macos.sh", "--frobnicate").returncode == 2
    out = _bash("build_macos.sh", "--notarize", "profile")  # notarizing needs a real identity
    assert out.returncode != 0 and "--notarize needs --sign" in out.stderr


def test_build_macos_is_strict_bash():
    text = (ROOT / "build_macos.sh").read_text()
    assert "set -euo pipefail" in text
    assert _bash("-n", "build_macos.sh").returncode == 0
    assert _bash("-n", "packaging/smoke_linux.sh").returncode == 0


def test_smoke_linux_help():
    out = _bash("packaging/smoke_linux.sh", "--help")
    assert out.returncode == 0 and "--self-test" in out.stdout
    assert _bash("packaging/smoke_linux.sh", "--bogus").returncode == 2


# -------------------------------------------------------------------------------- the spec
def test_spec_parses_and_has_the_required_pieces():
    text = SPEC.read_text()
    ast.parse(text)
    for piece in ('collect_submodules("mlx_lm")', 'collect_data_files("mlx_lm")', "BUNDLE(",
                  "COLLECT(", "exclude_binaries=True", "upx=False", 'target_arch="arm64"',
                  "argv_emulation=False", "launcher.py", "mb.EXCLUDES", "mb.info_plist(VERSION)",
                  "mb.metallib_entries", "mb.mlx_native_files", "mb.resources_datas",
                  "mb.verify_tree", "mb.prune_toc", "bundle_identifier=mb.BUNDLE_ID"):
        assert piece in text, piece
    # BUNDLE only on macOS: the same spec builds one-dir on Linux.
    tree = ast.parse(text)
    bundle_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and getattr(n.func, "id", None) == "BUNDLE"]
    ifs = [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "IS_MAC"]
    assert bundle_calls and any(c in list(ast.walk(i)) for i in ifs for c in bundle_calls)


def test_version_and_info_plist():
    assert mb.read_version(ROOT) == engine.__version__
    plist = mb.info_plist(engine.__version__)
    assert plist["LSMinimumSystemVersion"] == "14.0"
    assert plist["NSHighResolutionCapable"] is True
    assert plist["CFBundleIdentifier"] == "app.mtpchat.MTPChat"
    assert plist["CFBundleShortVersionString"] == engine.__version__
    assert "CFBundleDocumentTypes" not in plist
    plistlib.dumps(plist)  # serializable as-is


def test_version_mismatch_is_refused(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1.0.0"\n')
    (tmp_path / "engine" / "__init__.py").write_text('__version__ = "1.0.1"\n')
    with pytest.raises(ValueError, match="mismatch"):
        mb.read_version(tmp_path)


def test_excludes_cover_heavy_frameworks_and_unused_qt():
    for name in ("torch", "tensorflow", "jax", "PySide6.QtWebEngineCore", "PySide6.Qt3DCore",
                 "PySide6.QtQuick", "PySide6.QtQml", "PySide6.QtMultimedia"):
        assert name in mb.EXCLUDES
    for name in ("PySide6.QtCharts", "PySide6.QtSvg", "PySide6.QtWidgets", "mlx", "mlx_lm",
                 "PIL"):  # Pillow decodes the chat's images (engine/vision/image_io.py)
        assert name not in mb.EXCLUDES


def test_entitlements():
    ent = plistlib.loads((PACKAGING / "entitlements.plist").read_bytes())
    assert ent == {"com.apple.security.cs.allow-unsigned-executable-memory": True,
                   "com.apple.security.cs.disable-library-validation": True}


def test_requirements_macos_pins_everything_with_hashes():
    text = (PACKAGING / "requirements-macos.txt").read_text()
    reqs = [line.split(" ")[0] for line in text.splitlines() if "==" in line]
    names = {r.split("==")[0].lower().replace("_", "-") for r in reqs}
    for needed in ("mlx", "mlx-metal", "mlx-lm", "pyinstaller", "macholib", "transformers",
                   "pyside6-essentials", "pyside6-addons", "huggingface-hub", "platformdirs"):
        assert needed in names, needed
    # every run-time dependency of pyproject.toml is in the Mac build (pillow, starlette, mcp...
    # were missing once: the bundle would have failed at its first import of them)
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"sys_platform": "darwin"}):
            name = canonicalize_name(req.name)
            # the Mac build installs PySide6's wheels without the meta-package
            assert {"pyside6": "pyside6-essentials"}.get(name, name) in names, req.name
    assert "torch" not in names and "pyside6-webengine" not in names
    assert all(r.count("==") == 1 for r in reqs)
    assert text.count("--hash=sha256:") >= len(reqs)
    mlx = next(r for r in reqs if r.lower().startswith("mlx=="))
    metal = next(r for r in reqs if r.lower().startswith("mlx-metal=="))
    assert mlx.split("==")[1] == metal.split("==")[1]


# -------------------------------------------------------------- collection and bundle rules
def test_mlx_native_files_takes_the_whole_lib_folder(tmp_path):
    mlx = tmp_path / "mlx"
    (mlx / "lib" / "cmake" / "jaccl").mkdir(parents=True)
    for name in ("libmlx.dylib", "libjaccl.dylib", "mlx.metallib", "cmake/jaccl/x.cmake"):
        (mlx / "lib" / name).write_bytes(b"x")
    (tmp_path / "mlx_cpu.libs").mkdir()
    (tmp_path / "mlx_cpu.libs" / "libblas-1.so.3").write_bytes(b"x")
    binaries, datas = mb.mlx_native_files(mlx)
    assert sorted(Path(s).name for s, _ in binaries) == ["libblas-1.so.3", "libjaccl.dylib", "libmlx.dylib"]
    assert [(Path(s).name, d) for s, d in datas] == [("mlx.metallib", "mlx/lib")]
    assert ("mlx_cpu.libs" in {d for _, d in binaries})
    with pytest.raises(FileNotFoundError):
        mb.mlx_native_files(tmp_path / "nowhere")


def test_the_installed_mlx_is_collectable():
    binaries, _datas = mb.mlx_native_files(mb.package_dir("mlx"))
    assert any(Path(s).name.startswith("libmlx") for s, _ in binaries)


def test_resources_datas_skip_caches_and_partial_downloads(tmp_path):
    res = tmp_path / "resources"
    (res / "models" / "demo").mkdir(parents=True)
    (res / "__pycache__").mkdir()
    (res / "models" / "demo" / "config.json").write_text("{}")
    (res / "models" / "demo" / "w.safetensors.incomplete").write_text("")
    (res / "__pycache__" / "x.pyc").write_text("")
    (res / ".DS_Store").write_text("")
    (res / "__init__.py").write_text("")
    got = sorted((Path(s).name, d) for s, d in mb.resources_datas(res))
    assert got == [("__init__.py", "resources"), ("config.json", "resources/models/demo")]


def test_metallib_is_linked_beside_every_libmlx():
    toc = [("libmlx.dylib", "mlx/lib/libmlx.dylib", "SYMLINK"),
           ("mlx/lib/libmlx.dylib", "/s/libmlx.dylib", "BINARY"),
           ("mlx/lib/mlx.metallib", "/s/mlx.metallib", "DATA"),
           ("mlx/lib/libjaccl.dylib", "/s/libjaccl.dylib", "BINARY"),
           ("deep/er/libmlx.dylib", "/s/libmlx.dylib", "BINARY")]
    assert mb.metallib_entries(toc) == [
        ("mlx.metallib", "mlx/lib/mlx.metallib", "SYMLINK"),
        ("deep/er/mlx.metallib", "../../mlx/lib/mlx.metallib", "SYMLINK")]
    with pytest.raises(ValueError):
        mb.metallib_entries([e for e in toc if not e[0].endswith(".metallib")])


def test_prune_toc_drops_unused_qt_and_excluded_metadata():
    keep = ["PySide6/Qt/lib/libQt6Widgets.so.6", "PySide6/Qt/lib/QtCharts.framework/Versions/A/QtCharts",
            "PySide6/Qt/lib/libQt6OpenGL.so.6", "PySide6/Qt/plugins/imageformats/libqsvg.so",
            "tokenizers-0.23.3.dist-info/METADATA", "mlx/lib/libmlx.dylib"]
    drop = ["PySide6/Qt/lib/libQt6Quick.so.6", "libQt6Qml.so.6", "libQt6VirtualKeyboard.so.6",
            "PySide6/Qt/lib/QtQml.framework/Versions/A/QtQml", "PySide6/Qt/lib/libQt6Pdf.so.6",
            "PySide6/Qt/plugins/imageformats/libqpdf.so",
            "PySide6/Qt/plugins/platforminputcontexts/libqtvirtualkeyboardplugin.so",
            "torch-2.13.0+cpu.dist-info/METADATA"]
    toc = [(d, "src", "BINARY") for d in keep + drop]
    assert [e[0] for e in mb.prune_toc(toc)] == keep


def test_mac_bundle_layout_has_a_metallib_beside_every_libmlx(tmp_path):
    """Run PyInstaller's own .app relocation (BUNDLE._process_bundle_toc, private API of the
    pinned PyInstaller) on a TOC shaped like the real one, materialize the result and check
    it: proves on Linux that the spec's SYMLINK entries land where MLX looks on macOS."""
    osx = pytest.importorskip("PyInstaller.building.osx")
    toc = [("MTP Chat", "exe", "EXECUTABLE"),
           ("mlx/lib/libmlx.dylib", "libmlx.dylib", "BINARY"),
           ("mlx/lib/libjaccl.dylib", "libjaccl.dylib", "BINARY"),
           ("mlx/lib/mlx.metallib", "mlx.metallib", "DATA"),
           ("mlx/core.cpython-312-darwin.so", "core.so", "EXTENSION"),
           ("libmlx.dylib", "mlx/lib/libmlx.dylib", "SYMLINK"),  # added by PyInstaller on macOS
           ("mlx_lm/models/qwen3_5.py", "q.py", "DATA"),
           ("mlx_lm/models/qwen3_5_moe.py", "q.py", "DATA"),
           ("resources/models/demo/config.json", "c.json", "DATA")]
    toc += mb.metallib_entries(toc)
    bundle = osx.BUNDLE.__new__(osx.BUNDLE)._process_bundle_toc(toc)
    app = tmp_path / "MTP Chat.app"
    for dest, src, kind in sorted(bundle, key=lambda e: e[2] == "SYMLINK"):
        path = app / dest
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "SYMLINK":
            path.symlink_to(src)
        else:
            path.write_bytes(b"x")
    assert mb.verify_tree(app, mac=True) == []
    for folder in ("Contents/Frameworks", "Contents/Frameworks/mlx/lib", "Contents/Resources"):
        assert (app / folder / "libmlx.dylib").exists()
        assert (app / folder / "mlx.metallib").exists(), folder
    assert (app / "Contents/Resources/mlx/lib/mlx.metallib").is_file()  # the one real copy
    assert not (app / "Contents/Resources/mlx/lib/mlx.metallib").is_symlink()
    assert (app / "Contents/Frameworks/resources/models/demo/config.json").exists()  # _MEIPASS view


def _fake_frozen(root: Path, *, mac: bool) -> Path:
    lib = root / "mlx" / "lib"
    lib.mkdir(parents=True)
    (lib / ("libmlx.dylib" if mac else "libmlx.so")).write_bytes(b"x")
    (root / "mlx" / ("core.cpython-312-darwin.so" if mac else "core.cpython-311-x86_64-linux-gnu.so")).write_bytes(b"x")
    (root / "mlx_lm" / "models").mkdir(parents=True)
    for m in ("qwen3_5.py", "qwen3_5_moe.py"):
        (root / "mlx_lm" / "models" / m).write_text("")
    (root / "resources" / "models").mkdir(parents=True)
    if not mac:
        (root / "mlx_cpu.libs").mkdir()
    return root


def test_verify_tree_linux_layout(tmp_path):
    root = _fake_frozen(tmp_path / "linux", mac=False)
    assert mb.verify_tree(root, mac=False) == []
    (root / "torch").mkdir()
    (root / "libQt6Quick.so.6").write_bytes(b"x")
    (root / "mlx_lm" / "models" / "qwen3_5.py").unlink()
    problems = "\n".join(mb.verify_tree(root, mac=False))
    assert "torch" in problems and "libQt6Quick" in problems and "qwen3_5.py" in problems


def test_verify_tree_mac_needs_a_metallib_beside_each_libmlx(tmp_path):
    root = _fake_frozen(tmp_path / "app", mac=True)
    assert any("mlx.metallib" in p for p in mb.verify_tree(root, mac=True))
    (root / "mlx" / "lib" / "mlx.metallib").write_bytes(b"m")
    assert mb.verify_tree(root, mac=True) == []
    (root / "libmlx.dylib").symlink_to("mlx/lib/libmlx.dylib")  # PyInstaller's top-level link
    assert [p for p in mb.verify_tree(root, mac=True)] == ["libmlx.dylib has no mlx.metallib beside it"]
    (root / "mlx.metallib").symlink_to("mlx/lib/mlx.metallib")
    assert mb.verify_tree(root, mac=True) == []
    assert mb.main(["verify", str(root), "--mac"]) == 0


def _macho(minos: tuple[int, int], *, fat: bool = False) -> bytes:
    version = (minos[0] << 16) | (minos[1] << 8)
    build = struct.pack("<IIIIII", 0x32, 24, 1, version, version, 0)
    thin = struct.pack("<IiiIIIII", 0xFEEDFACF, 0x0100000C, 0, 6, 1, len(build), 0, 0) + build
    if not fat:
        return thin
    header = struct.pack(">II", 0xCAFEBABE, 1) + struct.pack(">iiIII", 0x0100000C, 0, 4096, len(thin), 14)
    return header.ljust(4096, b"\0") + thin


def test_minimum_macos_of_binaries(tmp_path):
    (tmp_path / "ok.dylib").write_bytes(_macho((14, 0)))
    (tmp_path / "fat.so").write_bytes(_macho((11, 0), fat=True))
    (tmp_path / "new.dylib").write_bytes(_macho((15, 2)))
    (tmp_path / "text.txt").write_text("not mach-o")
    assert mb.macho_min_os(tmp_path / "fat.so") == (11, 0)
    assert mb.macho_min_os(tmp_path / "text.txt") is None
    assert mb.too_new_binaries(tmp_path, (14, 0)) == ["new.dylib needs macOS 15.2"]
    assert mb.main(["minos", str(tmp_path), "--max", "14.0"]) == 1
    assert mb.main(["minos", str(tmp_path), "--max", "15.2"]) == 0


# ------------------------------------------------------------------------------- the icon
def test_icon_png_is_1024_square_with_transparency(qapp):
    from PySide6.QtGui import QImage

    img = QImage(str(PACKAGING / "icon" / "icon.png"))
    assert (img.width(), img.height()) == (1024, 1024)
    assert img.hasAlphaChannel()
    assert img.pixelColor(0, 0).alpha() == 0           # transparent margin (macOS icon grid)
    assert img.pixelColor(512, 512).alpha() == 255     # opaque body


def test_make_icns_writes_every_size(tmp_path, qapp):
    from PySide6.QtGui import QImage

    icns = _load("make_icns")
    out = icns.build_icns(PACKAGING / "icon" / "icon.png", tmp_path / "x.icns", backend="qt")
    entries = icns.read_icns(out.read_bytes())
    assert set(entries) == {t for t, _px, _n in icns.ENTRIES}
    for kind, px, _name in icns.ENTRIES:
        img = QImage.fromData(entries[kind], "PNG")
        assert (img.width(), img.height()) == (px, px), kind
    with pytest.raises(ValueError):
        icns.read_icns(b"icns\0\0\0\x09x")


def test_launcher_drops_finder_psn_argument(monkeypatch):
    import app.main

    launcher = _load("launcher")
    seen = {}
    monkeypatch.setattr(app.main, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    monkeypatch.setattr(sys, "argv", ["MTP Chat", "-psn_0_12345", "--quit-after", "1"])
    launcher.run()
    assert seen["argv"] == ["--quit-after", "1"]


# ---------------------------------------------------------------- the real Linux build (slow)
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux smoke build")
def test_smoke_linux_builds_and_self_tests(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("bash missing")
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("MTPCHAT_HOME", None)
    out = subprocess.run(["bash", "packaging/smoke_linux.sh", "--work", str(tmp_path / "work")],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "smoke test passed" in out.stdout
    assert "build size:" in out.stdout and "build time:" in out.stdout
