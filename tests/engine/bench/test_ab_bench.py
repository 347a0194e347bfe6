"""``engine.bench.ab``'s materialisation of a revision as ``engine_before``: the package
renamed, every reference to ``engine`` rewritten, and the two importing side by side without
sharing a module (no decoding here)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench.ab import engine_references, first_difference, materialise, rewrite

ROOT = Path(__file__).resolve().parents[3]


def test_rewrite_points_every_form_at_the_copy():
    src = ("from engine.types import Event\n"
           "from engine import decode, loading\n"
           "    from engine.server.guard import Guard\n"
           "import engine\n"
           "    import engine\n"
           "import engine.cycle\n"
           "import engine.cycle as cy\n"
           "import engine, os\n"
           "LOGGERS = ('asyncio', \"engine.server.guard\")\n"
           "mod = importlib.import_module('engine.decoding.drafters')\n"
           "from . import cycle\n"
           "from .cycle import Row\n"
           "import engineering\n"
           "from engine_tools import x\n"
           "text = 'the engine. It'\n")
    assert rewrite(src, "engine_before").splitlines() == [
        "from engine_before.types import Event",
        "from engine_before import decode, loading",
        "    from engine_before.server.guard import Guard",
        "import engine_before as engine",
        "    import engine_before as engine",
        "import engine_before.cycle; import engine_before as engine",
        "import engine_before.cycle as cy",
        "import engine_before as engine, os",
        "LOGGERS = ('asyncio', \"engine_before.server.guard\")",
        "mod = importlib.import_module('engine_before.decoding.drafters')",
        "from . import cycle",
        "from .cycle import Row",
        "import engineering",
        "from engine_tools import x",
        "text = 'the engine. It'",
    ]


def test_engine_references_finds_what_is_left(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "m.py").write_text("import os, engine\nX = 'engine.decoding.checks'\nfrom . import y\n")
    assert engine_references(pkg) == ["p/m.py:1 engine", "p/m.py:2 engine.decoding.checks"]


def test_first_difference_names_the_position():
    assert first_difference([[1, 2, 3]], [[1, 2, 3]]) is None
    assert "token 2" in first_difference([[1, 2, 3]], [[1, 2, 4]])
    assert "token 2" in first_difference([[1, 2]], [[1, 2, 5]])  # one stopped earlier
    assert first_difference([[1]], [[1], [2]]) == "1 streams before, 2 after"


_CHECK = """
import json, sys
from pathlib import Path
import engine
from engine.bench.ab import import_before, isolation_problems
dest = Path(sys.argv[1])
eb = import_before(dest)
import engine_before.models.model  # HEAD's loader and, through it, its decoder
print(json.dumps({
    "file": eb.__file__,
    "problems": isolation_problems(dest),
    "loaded": sorted(m for m in sys.modules if m.startswith("engine_before.")),
    "shared": eb.SamplingParams is getattr(engine, "SamplingParams", None),
    "after": engine.__file__,
}))
"""


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs git and this checkout's history")
def test_head_materialises_as_an_isolated_package(tmp_path):
    pkg = materialise("HEAD", tmp_path)
    assert pkg == tmp_path / "engine_before" and (pkg / "__init__.py").is_file()
    assert not (tmp_path / "engine").exists()
    assert engine_references(pkg) == []
    assert "from engine_before.errors import" in (pkg / "types.py").read_text("utf-8")
    # imported beside the working tree's engine in a fresh interpreter (sys.modules untouched)
    out = subprocess.run([sys.executable, "-c", _CHECK, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).resolve().is_relative_to(tmp_path.resolve())
    assert Path(got["after"]).resolve().is_relative_to(ROOT / "engine")
    assert got["problems"] == []
    assert "engine_before.models.model" in got["loaded"] and len(got["loaded"]) > 5
    assert got["shared"] is False


def test_a_bad_revision_is_a_clear_error(tmp_path):
    from engine.bench.ab import AbError

    with pytest.raises(AbError, match="git archive no-such-rev-xyz engine failed"):
        materialise("no-such-rev-xyz", tmp_path)
