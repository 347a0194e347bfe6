"""Other apps' model folders, built the way those apps write them (for discovery tests).

- :func:`make_hf_cache`: the Hugging Face hub cache — ``models--org--name/blobs/<sha256>`` holds
  each file once, ``snapshots/<commit>/<file>`` are relative symlinks into ``blobs``, and
  ``refs/main`` holds the commit (what ``hf download`` / ``snapshot_download`` leave behind);
- :func:`make_lmstudio`: LM Studio's ``<models>/<publisher>/<model>/`` plain files;
- :func:`make_mtplx`: MTPLX's ``<models>/<org>--<name>/`` plain files.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def make_hf_cache(cache: Path, repo_id: str, src: Path, *, commit: str | None = None) -> Path:
    """Put ``src``'s files into ``cache`` as the hub cache stores a snapshot; return it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit or hashlib.sha1(repo_id.encode()).hexdigest()
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = f.relative_to(src)
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snap


def make_lmstudio(models: Path, name: str, src: Path) -> Path:
    dest = models / name
    shutil.copytree(src, dest)
    return dest


def make_mtplx(models: Path, repo_id: str, src: Path) -> Path:
    dest = models / repo_id.replace("/", "--")
    shutil.copytree(src, dest)
    return dest


def point_at(monkeypatch, tmp_path: Path) -> dict[str, Path]:
    """Aim discovery at empty folders under ``tmp_path``; return them by kind."""
    roots = {"hf": tmp_path / "hf" / "hub", "lmstudio": tmp_path / "lmstudio",
             "mtplx": tmp_path / "mtplx"}
    for p in roots.values():
        p.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(roots["hf"]))
    monkeypatch.setenv("LMSTUDIO_MODELS_DIR", str(roots["lmstudio"]))
    monkeypatch.setenv("MTPLX_MODEL_DIR", str(roots["mtplx"]))
    monkeypatch.delenv("MTPCHAT_MODEL_DIRS", raising=False)
    return roots
