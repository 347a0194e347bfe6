"""The engine never imports Qt, and importing it is cheap."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"
QT_MODULES = ("PySide6", "shiboken6", "PyQt5", "PyQt6")


def test_import_engine_leaves_qt_out():
    code = (
        "import sys, engine, engine.cli, engine.types\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in %r]\n"
        "print(','.join(bad))\n" % (QT_MODULES,)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_no_engine_file_imports_qt():
    offenders = []
    for path in ENGINE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                if n.split(".")[0] in QT_MODULES or n.split(".")[0] == "app":
                    offenders.append(f"{path.relative_to(ENGINE.parent)}: {n}")
    assert offenders == []
