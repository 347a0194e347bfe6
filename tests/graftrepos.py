"""Raw source repos with ``mtp.*`` and their headless ``mlx_lm.convert`` conversions, for the
graft tests (tests/engine/hub/test_graft.py) and the app's graft test.

- ``SOURCES``: the embedded demo model's raw checkpoint, a tiny random dense and a tiny random
  MoE model in the real raw layout (two shards), and "another model of the same size" (the
  dense one with other weights);
- :func:`conversion`: what ``mlx_lm.convert`` writes from a source (4- or 8-bit; mlx-lm's
  qwen3_5 sanitize drops ``mtp.*``), with the model card mlx-community uploads carry
  (``base_model: <source>``) when ``card`` is set.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.fakehub import FakeRepo

DEMO_REPO = "Qwen/mtp-demo"
DENSE_REPO = "tiny/dense-src"
MOE_REPO = "tiny/moe-src"
OTHER_REPO = "tiny/dense-other"
CARD = "---\nbase_model: {repo}\nlibrary_name: mlx\ntags:\n- mlx\n---\n"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def raw_sources(work: Path) -> dict[str, Path]:
    from engine.paths import default_model_path
    from tests.tinymodels import build_tiny_model

    return {
        DEMO_REPO: default_model_path(),
        DENSE_REPO: build_tiny_model(work / "dense", seed=3, shards=2),
        MOE_REPO: build_tiny_model(work / "moe", moe=True, seed=4, shards=2),
        OTHER_REPO: build_tiny_model(work / "other", seed=5, shards=2),
    }


def fake_repos(sources: dict[str, Path]) -> dict[str, FakeRepo]:
    repos = {repo: FakeRepo(_files(path)) for repo, path in sources.items()}
    repos["tiny/gated-src"] = FakeRepo(_files(sources[DENSE_REPO]), gated=True)
    return repos


def conversion(src: Path, out: Path, *, bits: int | None, card: str | None = None) -> Path:
    """``mlx_lm.convert`` of ``src`` at ``bits`` (None: not quantized; its head dropped)."""
    from mlx_lm import convert

    if not out.exists():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        convert(str(src), str(tmp), quantize=bits is not None, q_bits=bits or 4)
        tmp.rename(out)
    if card:
        (out / "README.md").write_text(CARD.format(repo=card))
    return out


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (symlinks followed), by relative path."""
    import hashlib

    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}
