"""The local model store: where downloaded models live and what state they are in.

Layout (``root`` defaults to ``<data dir>/models``; the data dir is ``$MTPCHAT_HOME/data`` or
platformdirs' user data dir for "MTPChat", and the user may move the store with
:func:`set_store_root`)::

    <root>/<name>/                      an installed model (config.json, *.safetensors, ...)
    <root>/<name>/.mtpchat/installed.json   written last, only after every file was verified
    <root>/.partial/<name>/             a download in progress (resumable); see engine.hub.download

A folder is *installed* only when its marker exists and every file it lists has the recorded
size. A folder that looks like a model but has no marker (copied in by hand) is *unverified*;
one whose files do not match its marker is *corrupt*; a staging folder is *incomplete*. The
embedded demo model is always listed as *builtin*: read-only and not deletable.

Installed rows are validated: a marker whose recorded check failed, or a hand-copied folder
whose config or safetensors headers do not pass :mod:`engine.models.checkpoint`, is listed with its
problem and is not ``loadable``. :meth:`Store.resolve` (and :func:`resolve_model`) turn a
path, an installed name or a pulled repo id into a folder. Locations live in
:mod:`engine.paths`; a download, a conversion and a delete of one name exclude each other
through :meth:`Store.try_lock`.

Per-model facts that must also work for the read-only demo model (last used, the tuner's
result) live in small JSON files in the data dir, keyed by the model's resolved path.
"""
from __future__ import annotations

import contextlib
import hashlib
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

from engine.errors import ModelLoadError, StoreError, UnsupportedModelError
from engine.models.checkpoint import read_checkpoint
from engine.paths import (
    APP_NAME, data_dir, default_model_path, default_store_root as default_root, folder_size,
    settings_path, store_root, weights_identity,
)

log = logging.getLogger(__name__)

MARKER_DIR = ".mtpchat"
INSTALLED_FILE = "installed.json"
MANIFEST_FILE = "download.json"
PARTIAL_DIR = ".partial"
TRASH_DIR = ".trash"

Status = Literal["builtin", "installed", "unverified", "corrupt", "unsupported", "incomplete",
                 "external"]
dir_size = folder_size  # the name app/ uses

__all__ = ["InstalledModel", "Store", "data_dir", "default_root", "dir_size", "last_used",
           "mark_used", "model_name", "read_tuned", "read_tuned_depth", "resolve_model",
           "read_warm_hint", "set_store_root", "store_root", "weights_signature",
           "write_json_atomic", "write_tuned",
           "write_warm_hint", "APP_NAME"]


# ----------------------------------------------------------------------------- locations

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
    _put_entry("tuning.json", model_dir, machine or machine_key(),
               {"result": result, "written_at": time.time()})


def weights_signature(model_dir: str | Path) -> str:
    """What identifies the weights a folder holds now: its config and each safetensors file's
    name, size and modification time (hashed). A model updated in place (a new revision, a
    retrained demo shipped by an app update) gets another signature, so what was measured on
    the old weights (tuning, warm-up figures) is not taken for the new ones."""
    return hashlib.sha256(weights_identity(model_dir)).hexdigest()[:24]


def _entry(name: str, model_dir: str | Path, key: str) -> dict | None:
    """The entry ``_put_entry`` kept, if it was measured on the weights the folder holds now."""
    per_model = _read_json(data_dir() / name).get(_key(model_dir)) or {}
    entry = per_model.get(key)
    if not isinstance(entry, dict) or entry.get("weights") != weights_signature(model_dir):
        return None
    return entry


def _put_entry(name: str, model_dir: str | Path, key: str, entry: dict) -> None:
    """``entry`` under the model's key, then ``key`` (a machine's), in data_dir()/``name``,
    stamped with the weights' signature (``_entry`` reads only a matching one)."""
    entry = {**entry, "weights": weights_signature(model_dir)}

    def upd(d: dict) -> dict:
        per_model = d.get(_key(model_dir)) or {}
        per_model[key] = entry
        d[_key(model_dir)] = per_model
        return d
    _update_json(data_dir() / name, upd)


def read_tuned(model_dir: str | Path, *, machine: str | None = None) -> dict | None:
    entry = _entry("tuning.json", model_dir, machine or machine_key())
    return entry.get("result") if entry is not None else None


def read_tuned_depth(model_dir: str | Path, *, machine: str | None = None) -> int | None:
    """The tuner's best depth for this model on this machine, or None if never tuned here."""
    result = read_tuned(model_dir, machine=machine) or {}
    depth = result.get("best_depth", result.get("depth"))
    return int(depth) if isinstance(depth, (int, float)) and not isinstance(depth, bool) else None


def write_warm_hint(model_dir: str | Path, dtype: str, hint: dict, *,
                    machine: str | None = None) -> None:
    """Keep what a model's warm-up measured on this machine (``engine.core.warmup``: cycle
    seconds by batch size and depth, acceptance by draft position), so the next process's
    depth controllers start from it before its own warm-up has run."""
    _put_entry("warmup.json", model_dir, f"{machine or machine_key()}|{dtype}",
               {"hint": hint, "written_at": time.time()})


def read_warm_hint(model_dir: str | Path, dtype: str, *,
                   machine: str | None = None) -> dict | None:
    entry = _entry("warmup.json", model_dir, f"{machine or machine_key()}|{dtype}")
    hint = entry.get("hint") if entry is not None else None
    return hint if isinstance(hint, dict) else None


def write_token_counts(model_dir: str | Path, counts: dict) -> None:
    """Keep how often each token ended up in a model's replies (``engine.decoding.draft_vocab
    .TokenCounts``: the ids its draft steps score first), for these weights only. Counts of
    token ids, not text; in the data dir beside the tuning."""
    _put_entry("draft_vocab.json", model_dir, "counts",
               {"counts": counts, "written_at": time.time()})


def read_token_counts(model_dir: str | Path) -> dict | None:
    entry = _entry("draft_vocab.json", model_dir, "counts")
    counts = entry.get("counts") if entry is not None else None
    return counts if isinstance(counts, dict) else None


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
    location: str = "store"  # "store", "builtin", or where an external model lives
    location_label: str = "MTP Chat"
    memory_needed_bytes: int | None = None
    verdict: str | None = None
    mtp_offer: dict | None = None  # headless: where its MTP head can be grafted from (graft)

    @property
    def loadable(self) -> bool:
        return self.status in ("builtin", "installed", "unverified", "external")

    @property
    def external(self) -> bool:
        return self.location not in ("store", "builtin")

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


def _looks_like_model(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _summary(path: Path) -> dict:
    """family / quantization / has_mtp, read and validated by the one checkpoint reader."""
    ckpt = read_checkpoint(path)
    return {"family": ckpt.config.family, "quantization": ckpt.config.quantization,
            "has_mtp": ckpt.has_mtp}


def _problem_status(exc: Exception) -> Status:
    return "unsupported" if isinstance(exc, UnsupportedModelError) else "corrupt"


def resolve_model(ref: str | Path, *, root: str | Path | None = None) -> Path:
    """The model folder ``ref`` names: a path, an installed model's name (``list``), the demo's
    name, or the repo id a model was pulled from. Raises ModelLoadError ("Model folder not
    found") otherwise. The CLI's ``--model``, ``engine.load`` and the app resolve through this.
    """
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    try:
        return Store(root).resolve(ref)
    except OSError as exc:
        raise ModelLoadError(f"Model folder not found: {ref} (the model store cannot be read: "
                             f"{exc})") from exc


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
            rows.append(self._row(demo, demo.name, status="builtin", location="builtin",
                                  location_label="built in"))
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

    def loadable(self) -> list[InstalledModel]:
        """The models the app may offer to load (builtin, installed, unverified but valid)."""
        return [r for r in self.list(include_incomplete=False) if r.loadable]

    def get(self, name_or_path: str) -> InstalledModel | None:
        want = str(name_or_path)
        for row in self.list():
            if want in (row.name, row.path) or _key(want) == _key(row.path):
                return row
        return None

    def find(self, ref: str) -> InstalledModel | None:
        """The row for a name, a path, or the repo id a model was pulled from."""
        row = self.get(ref)
        if row is None:
            pulled = self._pulled_as(str(ref))
            row = self.get(str(pulled)) if pulled is not None else None
        return row

    def resolve(self, ref: str | Path) -> Path:
        """A model folder from a path, an installed name, or the repo id it was pulled from."""
        path = Path(ref).expanduser()
        if path.is_dir():
            return path
        text = str(ref).strip()
        demo = default_model_path()
        if text == demo.name:
            return demo
        if text and not text.startswith(".") and "/" not in text and \
                (self.root / text).is_dir():
            return self.root / text
        pulled = self._pulled_as(text)
        if pulled is not None:
            return pulled
        found = self._external_named(text)
        if found is not None:
            return found
        if any(r.repo_id == text for r in self.list(include_builtin=False)
               if r.status == "incomplete"):
            raise ModelLoadError(f"{text} is not fully downloaded yet: finish it with "
                                 f"`python -m engine pull {text}`.")
        raise ModelLoadError(f"Model folder not found: {text} (not a folder, nor a model "
                             f"installed in {self.root}; see `python -m engine list`).")

    def _pulled_as(self, repo_id: str) -> Path | None:
        """The newest installed model pulled from ``repo_id`` (its conversion if there is one)."""
        if "/" not in repo_id or not self.root.is_dir():
            return None
        found: list[tuple[float, Path]] = []
        for child in self.root.iterdir():
            if child.name.startswith(".") or not child.is_dir():
                continue
            marker = self.installed_marker(child) or {}
            rid = marker.get("repo_id")
            if isinstance(rid, str) and rid.casefold() == repo_id.casefold():
                stamp = marker.get("installed_at")
                found.append((stamp if isinstance(stamp, (int, float)) else 0.0, child))
        return max(found)[1] if found else None

    def _external_named(self, text: str) -> Path | None:
        """A model found outside the store (engine.hub.scan) by its org/name."""
        from engine.hub.scan import scan

        want = text.casefold()
        for f in scan():
            if want == f.name.casefold() and self.root.resolve() not in f.path.resolve().parents:
                return f.path
        return None

    def mark_used(self, name_or_path: str | Path, *, when: float | None = None) -> None:
        """Record that a model (by name, repo id or path) was loaded now."""
        mark_used(self.resolve(name_or_path), when=when)

    def installed_marker(self, model_dir: Path) -> dict | None:
        return _read_json(model_dir / MARKER_DIR / INSTALLED_FILE) or None

    def _row(self, path: Path, name: str, *, status: Status, **kw) -> InstalledModel:
        row = InstalledModel(
            name=name, path=str(path), status=status, size_bytes=kw.pop("size", None) or
            (folder_size(path) if path.is_dir() else 0),
            tuned_depth=read_tuned_depth(path), last_used=last_used(path),
            read_only=status == "builtin", deletable=status != "builtin", **kw)
        if status in ("builtin", "unverified") and row.family is None:
            if not path.is_dir():
                return replace(row, status="corrupt" if status != "builtin" else status,
                               problem="missing", deletable=status != "builtin")
            try:
                row = replace(row, **_summary(path))
            except ModelLoadError as exc:  # an unreadable model is reported, not raised
                row = replace(row, problem=str(exc),
                              status=_problem_status(exc) if status == "unverified" else status)
        return row

    def _installed_row(self, path: Path) -> InstalledModel:
        marker = self.installed_marker(path)
        if marker is None:
            if _looks_like_model(path):
                return self._row(path, path.name, status="unverified",
                                 problem="not installed by MTP Chat (no integrity record)")
            return self._row(path, path.name, status="corrupt",
                             problem="not a model folder (no config.json or weights)")
        summary = marker.get("summary") if isinstance(marker.get("summary"), dict) else {}
        problem = self._check_files(path, marker)
        status: Status = "corrupt" if problem else "installed"
        if not problem and (summary.get("problem") or summary.get("supported") is False):
            status, problem = "unsupported", str(summary.get("problem") or "not supported")
        return self._row(
            path, path.name, status=status, problem=problem,
            family=summary.get("family"), quantization=summary.get("quantization"),
            has_mtp=summary.get("has_mtp"), repo_id=marker.get("repo_id"),
            revision=marker.get("revision"))

    @staticmethod
    def _check_files(path: Path, marker: dict) -> str | None:
        """Cheap check (existence and size) against the install record."""
        files = marker.get("files")
        for rel, meta in (files if isinstance(files, dict) else {}).items():
            f = path / rel
            meta = meta if isinstance(meta, dict) else {}
            if not f.is_file():
                return f"missing file {rel}"
            if meta.get("size") is not None and f.stat().st_size != meta["size"]:
                return f"{rel} has {f.stat().st_size} bytes, expected {meta['size']}"
        return None

    def _incomplete_row(self, path: Path) -> InstalledModel:
        manifest = _read_json(path / MARKER_DIR / MANIFEST_FILE)
        total = sum(int(f.get("size") or 0) for f in manifest.get("files", []))
        return InstalledModel(
            name=path.name, path=str(path), status="incomplete", size_bytes=folder_size(path),
            repo_id=manifest.get("repo_id"), revision=manifest.get("revision"),
            bytes_total=total or None, problem="incomplete — resume to finish the download")

    # -- changes
    def delete(self, name: str) -> None:
        """Delete an installed model or an incomplete download. Never the builtin demo."""
        row = self.find(name)
        if row is None:
            raise StoreError(f"no model named {name!r} in {self.root}")
        if not row.deletable:
            raise StoreError(f"{row.name} is built into the app and cannot be deleted")
        path = Path(row.path).resolve()
        if self.root.resolve() not in path.parents:
            raise StoreError(f"refusing to delete {path}: it is outside the store {self.root}")
        lock = self.try_lock(row.name)
        if lock is None:
            raise StoreError(f"{row.name} is being downloaded or converted right now; cancel "
                             "that first, then delete it")
        try:
            self._remove_tree(path)
        finally:
            lock.close()
        log.info("deleted %s", path)

    def try_lock(self, name: str):
        """``name``'s exclusive lock (held while the returned file stays open), or None when a
        download, a conversion or a delete of ``name`` holds it (any process)."""
        self.ensure()
        path = self.partial_root / f"{name}.lock"
        fh = open(path, "a+")  # noqa: SIM115 - closed by the caller
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover - not a target platform
            return fh
        except OSError:
            fh.close()
            return None
        return fh

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
