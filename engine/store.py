"""The local model store: where downloaded models live and what state they are in.

Layout (``root`` defaults to ``<data dir>/models``; the data dir is ``$MTPCHAT_HOME/data`` or
platformdirs' user data dir for "MTPChat", and the user may move the store with
:func:`set_store_root`)::

    <root>/<name>/                      an installed model (config.json, *.safetensors, ...)
    <root>/<name>/.mtpchat/installed.json   written last, only after every file was verified
    <root>/.partial/<name>/             a download in progress (resumable); see engine.download

A folder is *installed* only when its marker exists and every file it lists has the recorded
size. A folder that looks like a model but has no marker (copied in by hand) is *unverified*;
one whose files do not match its marker is *corrupt*; a staging folder is *incomplete*. The
embedded demo model is always listed as *builtin*: read-only and not deletable.

Per-model facts that must also work for the read-only demo model (last used, the tuner's
result) live in small JSON files in the data dir, keyed by the model's resolved path.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from engine.errors import StoreError
from engine.resources import default_model_path

log = logging.getLogger(__name__)

APP_NAME = "MTPChat"
MARKER_DIR = ".mtpchat"
INSTALLED_FILE = "installed.json"
MANIFEST_FILE = "download.json"
PARTIAL_DIR = ".partial"
TRASH_DIR = ".trash"

Status = Literal["builtin", "installed", "unverified", "corrupt", "incomplete"]


# ----------------------------------------------------------------------------- locations

def data_dir() -> Path:
    """The engine's data dir (same place as app.paths.data_dir; the engine cannot import app)."""
    home = os.environ.get("MTPCHAT_HOME")
    if home:
        p = Path(home) / "data"
    else:
        import platformdirs

        p = Path(platformdirs.user_data_dir(APP_NAME, APP_NAME))
    p.mkdir(parents=True, exist_ok=True)
    return p


def settings_path() -> Path:
    return data_dir() / "model_store.json"


def default_root() -> Path:
    return data_dir() / "models"


def store_root(override: str | Path | None = None) -> Path:
    """``override``, else the user's chosen folder (``model_store.json``), else the default."""
    if override is not None:
        return Path(override).expanduser()
    chosen = _read_json(settings_path()).get("models_dir")
    return Path(chosen).expanduser() if chosen else default_root()


def set_store_root(path: str | Path | None) -> None:
    """Remember a new store folder (``None`` goes back to the default). Models are not moved."""
    def upd(d: dict) -> dict:
        if path is None:
            d.pop("models_dir", None)
        else:
            d["models_dir"] = str(Path(path).expanduser().resolve())
        return d
    _update_json(settings_path(), upd)


# ----------------------------------------------------------------------------- small JSON files

def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` so that readers see either the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not a target platform
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _update_json(path: Path, fn: Callable[[dict], dict]) -> dict:
    with _locked(path):
        data = fn(_read_json(path))
        write_json_atomic(path, data)
    return data


def _key(model_dir: str | Path) -> str:
    return str(Path(model_dir).expanduser().resolve())


# ----------------------------------------------------------------------------- last used / tuning

def mark_used(model_dir: str | Path, *, when: float | None = None) -> None:
    """Record that a model was loaded now (called by whoever loads a model)."""
    stamp = time.time() if when is None else when
    _update_json(data_dir() / "model_usage.json", lambda d: {**d, _key(model_dir): stamp})


def last_used(model_dir: str | Path) -> float | None:
    v = _read_json(data_dir() / "model_usage.json").get(_key(model_dir))
    return float(v) if isinstance(v, (int, float)) else None


def machine_key() -> str:
    """Identifies this machine class for tuning results (a result is only valid where measured)."""
    import psutil

    mem = round(psutil.virtual_memory().total / 2**30)
    return f"{platform.system()}-{platform.machine()}-{os.cpu_count()}cpu-{mem}GiB"


def write_tuned(model_dir: str | Path, result: dict, *, machine: str | None = None) -> None:
    """Store the tuner's result for a model on this machine.

    ``result`` is the tuner's JSON-able dict; ``result["best_depth"]`` (int, 0 = plain decoding)
    is what :func:`read_tuned_depth` returns.
    """
    if not isinstance(result, dict):
        raise StoreError("a tuning result must be a dict")
    entry = {"result": result, "written_at": time.time()}
    mkey = machine or machine_key()

    def upd(d: dict) -> dict:
        per_model = d.get(_key(model_dir)) or {}
        per_model[mkey] = entry
        d[_key(model_dir)] = per_model
        return d
    _update_json(data_dir() / "tuning.json", upd)


def read_tuned(model_dir: str | Path, *, machine: str | None = None) -> dict | None:
    per_model = _read_json(data_dir() / "tuning.json").get(_key(model_dir)) or {}
    entry = per_model.get(machine or machine_key())
    return entry.get("result") if isinstance(entry, dict) else None


def read_tuned_depth(model_dir: str | Path, *, machine: str | None = None) -> int | None:
    """The tuner's best depth for this model on this machine, or None if never tuned here."""
    result = read_tuned(model_dir, machine=machine) or {}
    depth = result.get("best_depth", result.get("depth"))
    return int(depth) if isinstance(depth, (int, float)) and not isinstance(depth, bool) else None


# ----------------------------------------------------------------------------- the store

@dataclass(frozen=True)
class InstalledModel:
    """One row of the store's listing. ``size_bytes`` is what is on disk now."""

    name: str
    path: str
    status: Status
    size_bytes: int
    family: str | None = None
    quantization: dict | None = None
    has_mtp: bool | None = None
    tuned_depth: int | None = None
    last_used: float | None = None
    repo_id: str | None = None
    revision: str | None = None
    read_only: bool = False
    deletable: bool = True
    problem: str | None = None
    bytes_total: int | None = None  # incomplete downloads: the size when finished

    @property
    def loadable(self) -> bool:
        return self.status in ("builtin", "installed", "unverified")

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def model_name(repo_id: str, *, revision: str = "main", suffix: str = "") -> str:
    """The folder name a repo is stored under: ``org--name[--rev][-suffix]``."""
    name = repo_id.strip("/").replace("/", "--")
    if revision and revision != "main":
        name += "--" + revision.replace("/", "-")[:40]
    if suffix:
        name += "-" + suffix
    if not name or name.startswith(".") or any(c in name for c in '\\:*?"<>|'):
        raise StoreError(f"cannot store a model named {name!r}")
    return name


def dir_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total


def _looks_like_model(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _summary(path: Path) -> dict:
    """family / quantization / has_mtp from config.json and the safetensors headers."""
    from engine.inspect import inspect_local

    info = inspect_local(path)
    return {k: info.get(k) for k in ("family", "quantization", "has_mtp")}


class Store:
    """A model store rooted at ``root`` (see the module docstring)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = store_root(root)

    @property
    def partial_root(self) -> Path:
        return self.root / PARTIAL_DIR

    def path_for(self, name: str) -> Path:
        return self.root / name

    def staging_path(self, name: str) -> Path:
        return self.partial_root / name

    def ensure(self) -> None:
        try:
            self.partial_root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the model folder {self.root}: {exc}") from exc

    # -- listing
    def list(self, *, include_builtin: bool = True, include_incomplete: bool = True
             ) -> list[InstalledModel]:
        rows: list[InstalledModel] = []
        if include_builtin:
            demo = default_model_path()
            rows.append(self._row(demo, demo.name, status="builtin"))
        if self.root.is_dir():
            for child in sorted(self.root.iterdir()):
                if child.name.startswith(".") or not child.is_dir():
                    continue
                rows.append(self._installed_row(child))
        if include_incomplete and self.partial_root.is_dir():
            for child in sorted(self.partial_root.iterdir()):
                if child.is_dir():
                    rows.append(self._incomplete_row(child))
        return rows

    def get(self, name_or_path: str) -> InstalledModel | None:
        want = str(name_or_path)
        for row in self.list():
            if want in (row.name, row.path) or _key(want) == _key(row.path):
                return row
        return None

    def installed_marker(self, model_dir: Path) -> dict | None:
        return _read_json(model_dir / MARKER_DIR / INSTALLED_FILE) or None

    def _row(self, path: Path, name: str, *, status: Status, **kw) -> InstalledModel:
        row = InstalledModel(
            name=name, path=str(path), status=status, size_bytes=kw.pop("size", None) or
            (dir_size(path) if path.is_dir() else 0),
            tuned_depth=read_tuned_depth(path), last_used=last_used(path),
            read_only=status == "builtin", deletable=status != "builtin", **kw)
        if status in ("builtin", "unverified") and row.family is None:
            if not path.is_dir():
                return replace(row, status="corrupt" if status != "builtin" else status,
                               problem="missing", deletable=status != "builtin")
            try:
                row = replace(row, **_summary(path))
            except Exception as exc:  # noqa: BLE001 - any unreadable model is reported, not raised
                row = replace(row, problem=str(exc),
                              status="corrupt" if status == "unverified" else status)
        return row

    def _installed_row(self, path: Path) -> InstalledModel:
        marker = self.installed_marker(path)
        if marker is None:
            if _looks_like_model(path):
                return self._row(path, path.name, status="unverified",
                                 problem="not installed by MTP Chat (no integrity record)")
            return self._row(path, path.name, status="corrupt",
                             problem="not a model folder (no config.json or weights)")
        summary = marker.get("summary") or {}
        problem = self._check_files(path, marker)
        return self._row(
            path, path.name, status="corrupt" if problem else "installed", problem=problem,
            family=summary.get("family"), quantization=summary.get("quantization"),
            has_mtp=summary.get("has_mtp"), repo_id=marker.get("repo_id"),
            revision=marker.get("revision"))

    @staticmethod
    def _check_files(path: Path, marker: dict) -> str | None:
        """Cheap check (existence and size) against the install record."""
        for rel, meta in (marker.get("files") or {}).items():
            f = path / rel
            if not f.is_file():
                return f"missing file {rel}"
            if meta.get("size") is not None and f.stat().st_size != meta["size"]:
                return f"{rel} has {f.stat().st_size} bytes, expected {meta['size']}"
        return None

    def _incomplete_row(self, path: Path) -> InstalledModel:
        manifest = _read_json(path / MARKER_DIR / MANIFEST_FILE)
        total = sum(int(f.get("size") or 0) for f in manifest.get("files", []))
        return InstalledModel(
            name=path.name, path=str(path), status="incomplete", size_bytes=dir_size(path),
            repo_id=manifest.get("repo_id"), revision=manifest.get("revision"),
            bytes_total=total or None, problem="incomplete — resume to finish the download")

    # -- changes
    def delete(self, name: str) -> None:
        """Delete an installed model or an incomplete download. Never the builtin demo."""
        row = self.get(name)
        if row is None:
            raise StoreError(f"no model named {name!r} in {self.root}")
        if not row.deletable:
            raise StoreError(f"{row.name} is built into the app and cannot be deleted")
        path = Path(row.path).resolve()
        if self.root.resolve() not in path.parents:
            raise StoreError(f"refusing to delete {path}: it is outside the store {self.root}")
        self._remove_tree(path)
        log.info("deleted %s", path)

    def _remove_tree(self, path: Path) -> None:
        # Move out of the way first so a crash mid-delete never leaves a half model listed.
        trash = self.root / TRASH_DIR / f"{path.name}.{os.getpid()}.{time.time_ns()}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, trash)
        except OSError as exc:
            raise StoreError(f"cannot delete {path}: {exc}") from exc
        shutil.rmtree(trash, ignore_errors=True)

    def install(self, staging: Path, name: str, record: dict) -> Path:
        """Atomically move a verified staging folder into the store as ``name``.

        ``record`` (repo_id, revision, commit, files {rel: {size, sha256}}, summary...) becomes
        the install marker, written inside the staging folder before the rename so the model
        appears in the store complete or not at all. An existing model of that name is replaced.
        """
        self.ensure()
        marker = staging / MARKER_DIR / INSTALLED_FILE
        for leftover in (staging / MARKER_DIR).glob("*.lock"):
            leftover.unlink(missing_ok=True)
        (staging / MARKER_DIR / MANIFEST_FILE).unlink(missing_ok=True)
        write_json_atomic(marker, {**record, "installed_at": time.time()})
        dest = self.path_for(name)
        if dest.exists():
            self._remove_tree(dest)
        try:
            os.replace(staging, dest)
        except OSError as exc:
            raise StoreError(f"cannot move {staging} into {dest}: {exc}") from exc
        return dest
