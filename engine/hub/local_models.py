"""Models on this machine outside the store: listed with the inspect verdict, used or imported.

:func:`external_rows` turns what :mod:`engine.hub.scan` finds into :class:`InstalledModel` rows
(``status="external"`` when the loader accepts the folder, else "unsupported"/"corrupt" with
the reason), marked with where they live. They are read-only: MTP Chat uses them in place and
never deletes them (:func:`refuse_delete` says where they are and how to remove them with the
owning app). :func:`import_model` puts one into the store — hard links when the store is on the
same filesystem (no extra disk), a copy otherwise — and installs it atomically with a record of
where it came from. Deleting the imported copy removes only the store's links: the cache's
files stay as they were.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

from engine.errors import ModelLoadError, StoreError
from engine.hub.scan import Found, scan
from engine.hub.store import MARKER_DIR, InstalledModel, Store, last_used, model_name, \
    read_tuned_depth
from engine.paths import folder_size

log = logging.getLogger(__name__)

REMOVE_HINT = {
    "hf-cache": "remove it with `hf cache delete` (or `huggingface-cli delete-cache`)",
    "lmstudio": "remove it in LM Studio's My Models",
    "mtplx": "remove it with `mtplx remove NAME`",
    "folder": "delete the folder yourself",
}


def _verdict_fields(path: Path, total_memory: int | None, repo_id: str | None = None) -> dict:
    """family / MTP / quantization / memory verdict from the one checkpoint reader."""
    from engine.hub.inspection import inspect_local

    try:
        r = inspect_local(path, repo_id=repo_id)
    except ModelLoadError as exc:
        return {"status": "corrupt", "problem": str(exc)}
    verdict = r["machine"]["verdict"]
    if total_memory is not None:
        from engine.hub.catalog import memory_verdict

        verdict = memory_verdict(r["memory_needed_bytes"], total_memory=total_memory)["verdict"]
    fields = {"family": r["family"], "quantization": r["quantization"], "has_mtp": r["has_mtp"],
              "memory_needed_bytes": r["memory_needed_bytes"], "verdict": verdict,
              "status": "external", "mtp_offer": r.get("mtp_head")}
    if not r["supported"]:
        reason = "; ".join(x for x in r["reasons"] if x.startswith(("not ", "cannot")))
        unsupported = reason.startswith("not supported")
        fields.update(status="unsupported" if unsupported else "corrupt", problem=reason)
    return fields


def row_for(found: Found, *, total_memory: int | None = None) -> InstalledModel:
    row = InstalledModel(
        name=found.name, path=str(found.path), status="external",
        size_bytes=folder_size(found.path), repo_id=found.name if "/" in found.name else None,
        revision=found.revision, read_only=True, deletable=False, location=found.kind,
        location_label=found.label, tuned_depth=read_tuned_depth(found.path),
        last_used=last_used(found.path))
    return replace(row, **_verdict_fields(found.path, total_memory, row.repo_id))


def grafted_originals(store: Store | None = None) -> set[str]:
    """The folders (resolved) whose grafted copy is in the store (``graft`` records them)."""
    store = store or Store()
    out = set()
    if not store.root.is_dir():
        return out
    for child in store.root.iterdir():
        if child.name.startswith(".") or not child.is_dir():
            continue
        graft = (store.installed_marker(child) or {}).get("graft")
        if isinstance(graft, dict) and isinstance(graft.get("original"), str):
            out.add(str(Path(graft["original"]).resolve()))
    return out


def with_offers(rows: list[InstalledModel], *, online: bool = False,
                store: Store | None = None) -> list[InstalledModel]:
    """Rows of headless loadable models with where their MTP head can be grafted from
    (remembered offers only unless ``online``); none for a model whose grafted copy is
    already in the store."""
    from engine.hub.graft_source import head_offer

    done = grafted_originals(store)
    out = []
    for r in rows:
        if str(Path(r.path).resolve()) in done:
            r = replace(r, mtp_offer=None)
        elif r.has_mtp is False and r.loadable and (r.mtp_offer is None or online and
                                                    not r.mtp_offer.get("bytes")):
            r = replace(r, mtp_offer=head_offer(Path(r.path), repo_id=r.repo_id, online=online)
                        or r.mtp_offer)
        out.append(r)
    return out


def external_rows(store: Store | None = None, *, found: list[Found] | None = None,
                  total_memory: int | None = None) -> list[InstalledModel]:
    """Rows for every model found outside ``store`` (folders inside the store are skipped)."""
    root = (store or Store()).root.resolve()
    rows = []
    for f in scan() if found is None else found:
        real = f.path.resolve()
        if real == root or root in real.parents:
            continue
        rows.append(row_for(f, total_memory=total_memory))
    return rows


def find_external(ref: str, store: Store | None = None) -> InstalledModel | None:
    """The external row named ``ref`` (its org/name or its path)."""
    want = str(ref).casefold()
    for f in scan():
        if want in (f.name.casefold(), str(f.path).casefold()):
            root = (store or Store()).root.resolve()
            if root not in f.path.resolve().parents:
                return row_for(f)
    return None


def refuse_delete(row: InstalledModel) -> StoreError:
    """The error `rm` gives for a model that lives outside the store."""
    hint = REMOVE_HINT.get(row.location, REMOVE_HINT["folder"])
    return StoreError(f"{row.name} is not in MTP Chat's store: it lives in the "
                      f"{row.location_label} at {row.path}, and MTP Chat never deletes it "
                      f"there; to free that space, {hint}")


# ----------------------------------------------------------------------------- import

def files_of(src: Path) -> list[Path]:
    """The model's files, relative to ``src`` (hidden entries skipped; symlinks followed)."""
    out = []
    for dirpath, dirs, files in os.walk(src, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith("."):
                out.append((Path(dirpath) / name).relative_to(src))
    return sorted(out)


def link_or_copy(src: Path, dst: Path, *, link: bool) -> bool:
    """Hard-link ``src``'s real file at ``dst`` (True), or copy it when linking is impossible."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    real = src.resolve()
    if link:
        try:
            os.link(real, dst)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP,
                                 errno.EACCES):
                raise
    shutil.copy2(real, dst)
    return False


def import_model(path: str | Path, *, store: Store | None = None, name: str | None = None,
                 link: bool = True) -> tuple[Path, int, int]:
    """Import the model at ``path`` into the store; returns (folder, files linked, copied)."""
    from engine.hub.inspection import inspect_local

    store = store or Store()
    src = Path(path)
    report = inspect_local(src)
    if not report["supported"]:
        raise StoreError(f"{src} cannot be imported: {'; '.join(report['reasons'])}")
    found = next((f for f in scan() if f.path.resolve() == src.resolve()), None)
    name = name or model_name(found.name if found else src.name)
    if store.path_for(name).exists():
        raise StoreError(f"a model named {name} is already in {store.root}; delete it first or "
                         "choose another name")
    lock = store.try_lock(name)
    if lock is None:
        raise StoreError(f"{name} is being downloaded, converted or deleted right now")
    try:
        return _import_locked(src, store, name, report, found, link=link)
    finally:
        lock.close()


def _import_locked(src: Path, store: Store, name: str, report: dict, found: Found | None, *,
                   link: bool) -> tuple[Path, int, int]:
    staging = store.staging_path(name)
    shutil.rmtree(staging, ignore_errors=True)
    linked = copied = 0
    files = {}
    try:
        for rel in files_of(src):
            if link_or_copy(src / rel, staging / rel, link=link):
                linked += 1
            else:
                copied += 1
            files[rel.as_posix()] = {"size": (staging / rel).stat().st_size}
        record = {"repo_id": found.name if found and "/" in found.name else None,
                  "revision": found.revision if found else None, "imported_from": str(src),
                  "location": found.kind if found else "folder", "files": files,
                  "summary": {k: report.get(k) for k in ("family", "quantization", "has_mtp",
                                                         "layout", "parameters", "supported")}}
        dest = store.install(staging, name, record)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("imported %s as %s (%d linked, %d copied)", src, dest, linked, copied)
    return dest, linked, copied


__all__ = ["MARKER_DIR", "external_rows", "with_offers", "find_external", "import_model", "refuse_delete",
           "row_for"]
