"""Every location the engine reads or writes, and safe path arithmetic inside a model folder.

- ``data_dir()``: ``$MTPCHAT_HOME/data``, else platformdirs' user data dir for "MTPChat" (the
  app's ``app.paths.data_dir`` is this same function).
- ``store_root()``: the model store — an explicit override, else the folder the user chose
  (remembered in ``<data dir>/model_store.json``), else ``<data dir>/models``.
- ``cache_dir()``: ``$MTPCHAT_HOME/cache``, else platformdirs' user cache dir for "MTPChat"
  (disposable data: the prompt cache on disk lives under ``cache_dir()/prompt-cache``).
- ``folder_size(path)``: bytes of the regular files under a folder (symlinked files counted by
  their target; symlinked folders not followed).
- ``weights_identity(folder)``: the bytes that identify the weights a model folder holds now
  (its config, and each safetensors file's name, size and mtime): the disk prompt cache and
  the store's tuning and warm-up figures hash them.
- ``inside(folder, rel)``: a file named by a model's own metadata, refused when it leaves the
  folder (``..``, an absolute path, or a symlink resolving elsewhere) — except that a snapshot
  of the Hugging Face cache (``models--org--name/snapshots/<sha>/``) may link into its own
  repo's ``blobs/`` folder, which is how that cache stores every file.

Nothing here imports another engine module except ``engine.errors`` and ``engine.resources``.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from engine.errors import ModelLoadError
from engine.resources import default_model_path, resources_dir

log = logging.getLogger(__name__)

APP_NAME = "MTPChat"
SETTINGS_FILE = "model_store.json"

__all__ = ["APP_NAME", "app_dir", "cache_dir", "data_dir", "default_model_path", "default_store_root", "folder_size",
           "weights_identity", "hf_cache_blobs", "inside", "resources_dir", "settings_path", "store_root"]


def app_dir(kind: str, *, create: bool = True) -> Path:
    """The app's ``kind`` folder ("data", "cache", "config" or "log"), created if needed
    (``create=False``: only named, for a reader that copes with its absence):
    ``$MTPCHAT_HOME/<kind>`` when set (tests, portable installs; "log" is "logs"), else the
    platformdirs location."""
    home = os.environ.get("MTPCHAT_HOME")
    if home:
        p = Path(home) / ("logs" if kind == "log" else kind)
    else:
        import platformdirs

        p = Path(getattr(platformdirs, f"user_{kind}_dir")(APP_NAME, APP_NAME))
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


def data_dir() -> Path:
    """The data dir (created if needed)."""
    return app_dir("data")


def cache_dir() -> Path:
    """The cache dir (created if needed): what can be deleted at any time."""
    return app_dir("cache")


def settings_path() -> Path:
    return data_dir() / SETTINGS_FILE


def default_store_root() -> Path:
    return data_dir() / "models"


def store_root(override: str | Path | None = None) -> Path:
    """``override``, else the user's chosen folder (``model_store.json``), else the default."""
    if override is not None:
        return Path(override).expanduser()
    try:
        chosen = json.loads(settings_path().read_text(encoding="utf-8")).get("models_dir")
    except (OSError, ValueError, AttributeError):
        chosen = None
    return Path(chosen).expanduser() if isinstance(chosen, str) and chosen else default_store_root()


def folder_size(path: str | Path) -> int:
    """Bytes of the regular files under ``path`` (0 for a missing folder)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def weights_identity(folder: str | Path) -> bytes:
    """See the module docstring (a file that vanishes meanwhile is left out)."""
    folder = Path(folder).expanduser().resolve()
    out = []
    try:
        out.append((folder / "config.json").read_bytes())
    except OSError:
        pass
    for f in sorted(folder.glob("*.safetensors")):
        try:
            st = f.stat()
        except OSError:
            continue
        out.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return b"".join(out)


def inside(folder: Path, rel: object, *, what: str) -> Path:
    """``folder / rel`` when ``rel`` is a plain relative path that stays inside ``folder``."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise ModelLoadError(f"{what} names an invalid file ({rel!r}).")
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts or rel.startswith(("/", "\\")):
        raise ModelLoadError(f"{what} names {rel!r}, outside the model folder: refused.")
    path = folder / rel
    try:
        real, root = path.resolve(), folder.resolve()
    except (OSError, RuntimeError) as exc:  # symlink loops
        raise ModelLoadError(f"{what}: cannot resolve {rel!r} ({exc}).") from exc
    if root not in real.parents and not _in_hf_blobs(folder, real):
        raise ModelLoadError(
            f"{what} names {rel!r}, which resolves outside the model folder ({real}): refused.")
    return path


def hf_cache_blobs(folder: Path) -> Path | None:
    """``models--org--name/blobs`` when ``folder`` is a snapshot of the Hugging Face cache."""
    try:
        snap = folder.resolve()
    except (OSError, RuntimeError):
        return None
    repo = snap.parent.parent
    if snap.parent.name != "snapshots" or not repo.name.startswith("models--"):
        return None
    return repo / "blobs"


def _in_hf_blobs(folder: Path, real: Path) -> bool:
    blobs = hf_cache_blobs(folder)
    return blobs is not None and real.parent == blobs.resolve()
