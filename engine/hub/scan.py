"""Models already on this machine, outside MTP Chat's own store.

Other apps keep models where users already have them; MTP Chat finds them there and uses them
in place (no copy) or imports them into its store (a hard link when on the same filesystem):

- the **Hugging Face cache** (``hf download``, transformers, mlx-lm): ``$HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache/huggingface/hub``).
  A repo is ``models--org--name/snapshots/<sha>/`` whose files are symlinks into
  ``models--org--name/blobs/``; the snapshot ``refs/main`` names is used, else the newest;
- **LM Studio**: ``$LMSTUDIO_MODELS_DIR``, ``~/.lmstudio/models`` and the older
  ``~/.cache/lm-studio/models``, laid out ``<publisher>/<model>/``;
- **MTPLX**: ``$MTPLX_MODEL_DIR``, else ``~/.mtplx/models``, laid out ``<org>--<name>/``;
- any folders listed in ``$MTPCHAT_MODEL_DIRS`` (``os.pathsep``-separated), searched two levels
  deep.

Only folders with a ``config.json`` and safetensors weights are reported; what they hold is
judged later by the one checkpoint reader (``engine.hub.inspection.inspect_local``). Nothing here
reads weights, follows symlinked folders, or writes anything.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

KINDS = ("hf-cache", "mtplx", "lmstudio", "folder")
LABELS = {"hf-cache": "Hugging Face cache", "mtplx": "MTPLX", "lmstudio": "LM Studio",
          "folder": "folder"}
MAX_ENTRIES = 2000  # per location: a pathological folder must not stall the listing


@dataclass(frozen=True)
class Location:
    kind: str    # one of KINDS
    root: Path

    @property
    def label(self) -> str:
        return LABELS[self.kind]


@dataclass(frozen=True)
class Found:
    """A model folder found outside the store."""

    path: Path
    kind: str
    root: Path
    name: str                 # org/name (or publisher/model): what `list` shows
    revision: str | None = None  # the snapshot's commit, for the Hugging Face cache

    @property
    def label(self) -> str:
        return LABELS[self.kind]


def hf_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else \
        Path.home() / ".cache"
    return base / "huggingface" / "hub"


def locations(env: Mapping[str, str] | None = None) -> list[Location]:
    """Where to look, in order of preference (a model found twice is reported once)."""
    env = os.environ if env is None else env
    home = Path.home()
    out = [Location("hf-cache", hf_cache_dir(env))]
    out.append(Location("mtplx", Path(env["MTPLX_MODEL_DIR"]).expanduser()
                        if env.get("MTPLX_MODEL_DIR") else home / ".mtplx" / "models"))
    lms = [Path(env["LMSTUDIO_MODELS_DIR"]).expanduser()] if env.get("LMSTUDIO_MODELS_DIR") \
        else [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    out += [Location("lmstudio", p) for p in lms]
    for part in (env.get("MTPCHAT_MODEL_DIRS") or "").split(os.pathsep):
        if part.strip():
            out.append(Location("folder", Path(part.strip()).expanduser()))
    return out


def looks_like_model(path: Path) -> bool:
    try:
        return (path / "config.json").is_file() and any(path.glob("*.safetensors"))
    except OSError:
        return False


def _children(path: Path) -> list[Path]:
    try:
        kids = [p for p in sorted(path.iterdir())[:MAX_ENTRIES]
                if not p.name.startswith(".") and p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    return kids


def _hf_snapshot(repo: Path) -> tuple[Path, str] | None:
    """The snapshot ``refs/main`` points at, else the newest one."""
    snaps = repo / "snapshots"
    try:
        ref = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        ref = ""
    if ref and (snaps / ref).is_dir():
        return snaps / ref, ref
    cands = [p for p in _children(snaps) if looks_like_model(p)]
    if not cands:
        return None
    best = max(cands, key=lambda p: p.stat().st_mtime)
    return best, best.name


def _scan_hf(loc: Location) -> list[Found]:
    out = []
    for repo in _children(loc.root):
        if not repo.name.startswith("models--"):
            continue
        snap = _hf_snapshot(repo)
        if snap is None or not looks_like_model(snap[0]):
            continue
        name = repo.name[len("models--"):].replace("--", "/", 1)
        out.append(Found(snap[0], loc.kind, loc.root, name, snap[1]))
    return out


def _scan_nested(loc: Location, depth: int) -> list[Found]:
    """Model folders up to ``depth`` levels below the root (``publisher/model``)."""
    out: list[Found] = []
    frontier = [loc.root]
    for _ in range(depth):
        nxt = []
        for folder in frontier:
            for child in _children(folder):
                if looks_like_model(child):
                    rel = child.relative_to(loc.root).as_posix()
                    name = rel.replace("--", "/", 1) if loc.kind == "mtplx" else rel
                    out.append(Found(child, loc.kind, loc.root, name))
                else:
                    nxt.append(child)
        frontier = nxt
    return out


def scan(locs: list[Location] | None = None) -> list[Found]:
    """Every model folder in ``locs`` (default: :func:`locations`), each real folder once."""
    found: list[Found] = []
    seen: set[Path] = set()
    for loc in locations() if locs is None else locs:
        if not loc.root.is_dir():
            continue
        try:
            items = _scan_hf(loc) if loc.kind == "hf-cache" else \
                _scan_nested(loc, 1 if loc.kind == "mtplx" else 2)
        except OSError as exc:  # an unreadable location is skipped, not fatal
            log.warning("cannot scan %s: %s", loc.root, exc)
            continue
        for f in items:
            real = f.path.resolve()
            if real not in seen:
                seen.add(real)
                found.append(f)
    return found
