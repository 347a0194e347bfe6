"""Resumable, verified, atomic model downloads into the store.

huggingface_hub deletes its ``*.incomplete`` files on error, so this module downloads file by
file itself, with HTTP Range requests into ``<store>/.partial/<name>/``:

1. pin the repo's commit and list its files (sizes, LFS sha256, git blob ids);
2. keep every file already finished by an earlier run (a finished file only ever gets its
   final name after it was verified) and resume every ``*.part`` from its last byte;
3. check free disk space for what is left (and for the conversion, if asked);
4. fetch each remaining file, retrying dropped connections, timeouts and 5xx with backoff and
   resuming from the byte reached; verify size and hash; rename ``x.part`` -> ``x``;
5. write the install record and rename the staging folder into the store (atomic).

Cancelling keeps what was fetched. Progress goes to a callback as
:class:`engine.hub.client.DownloadProgress`, from the download thread and from a small monitor thread
that also notices stalls (no byte for ``stall_after_s``) and makes cancel immediate.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine.errors import HubError, ModelLoadError
from engine.hub import client as hub
from engine.hub.client import (DownloadProgress, DownloadResult, IntegrityError, NotEnoughDiskError,
                        RemoteFile, RepoListing)
from engine.hub.inspection import inspect_local, needed_file
from engine.hub.store import MANIFEST_FILE, MARKER_DIR, Store, model_name, write_json_atomic
from engine.models.checkpoint import read_config

log = logging.getLogger(__name__)

DISK_MARGIN = 1.02
ProgressFn = Callable[[DownloadProgress], None]


class Cancelled(Exception):
    """Raised inside a transfer when its cancel event is set; callers that drive a
    ``Downloader`` (pull, stream conversion) raise it too, to stop the same way."""


class _Retryable(Exception):
    """A transfer problem worth retrying (network, timeout, 5xx, early end of body)."""


def _hasher(f: RemoteFile):
    if f.sha256:
        return hashlib.sha256()
    if f.git_oid:
        h = hashlib.sha1()  # git blob id: sha1("blob <size>\0" + content)
        h.update(b"blob %d\0" % f.size)
        return h
    return None


def _expected_digest(f: RemoteFile) -> str | None:
    return f.sha256 or f.git_oid


class Downloader:
    """Download ``repo_id`` into ``store`` as ``name``; call :meth:`run` (blocking).

    Thread-safety: ``run`` runs in the caller's thread; ``cancel`` may be set from anywhere.
    ``free_space`` (bytes free at a path) and the timing knobs exist for tests.
    """

    def __init__(self, repo_id: str, *, revision: str = "main", token: str | None = None,
                 store: Store | None = None, name: str | None = None,
                 progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                 stall_after_s: float = 30.0, read_timeout_s: float = 60.0,
                 max_retries: int = 5, retry_backoff_s: float = 1.0, tick_s: float = 0.5,
                 chunk_size: int = 1 << 20,
                 extra_disk_bytes: int | Callable[[int], int] = 0,
                 free_space: Callable[[Path], int] | None = None) -> None:
        self.repo_id, self.revision = repo_id, revision
        self.token = hub.resolve_token(token)
        self.store = store or Store()
        self.name = name or model_name(repo_id, revision=revision)
        self.progress_fn = progress
        self.cancel = cancel or threading.Event()
        self.stall_after_s, self.read_timeout_s = stall_after_s, read_timeout_s
        self.max_retries, self.retry_backoff_s = max_retries, retry_backoff_s
        self.tick_s, self.chunk_size = tick_s, chunk_size
        self.extra_disk_bytes = extra_disk_bytes
        self.free_space = free_space or _free_space
        self.staging = self.store.staging_path(self.name)
        self._lock = threading.RLock()
        self._emit_lock = threading.Lock()
        self._state = DownloadProgress(repo_id=repo_id, phase="planning", name=self.name)
        self._fetched = 0
        self._window: deque[tuple[float, int]] = deque()
        self._last_byte = time.monotonic()
        self._resp = None
        self._hash = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ progress
    def _update(self, emit: bool = True, **changes) -> None:
        with self._lock:
            self._state = replace(self._state, **changes)
        if emit:
            self._emit()

    def _snapshot(self) -> DownloadProgress:
        with self._lock:
            now = time.monotonic()
            while len(self._window) > 1 and now - self._window[0][0] > 5.0:
                self._window.popleft()
            speed = 0.0
            if self._window:
                t0, b0 = self._window[0]
                if now - t0 > 0.2:
                    speed = (self._fetched - b0) / (now - t0)
            st = self._state
            left = st.bytes_total - st.bytes_done
            idle = now - self._last_byte
            stalled = st.phase == "downloading" and idle >= self.stall_after_s
            return replace(st, speed_bps=speed, eta_s=left / speed if speed > 0 else None,
                           stalled=stalled, stalled_for_s=idle if stalled else 0.0)

    def _emit(self) -> None:
        if self.progress_fn is None:
            return
        snap = self._snapshot()
        with self._emit_lock:
            try:
                self.progress_fn(snap)
            except Exception:  # noqa: BLE001 - a broken observer must not break the download
                log.exception("progress callback failed")

    def _add_bytes(self, n: int) -> None:
        with self._lock:
            self._fetched += n
            now = time.monotonic()
            self._last_byte = now
            self._window.append((now, self._fetched))
            st = self._state
            self._state = replace(st, bytes_done=st.bytes_done + n,
                                  file_bytes_done=st.file_bytes_done + n)

    def _monitor(self) -> None:
        while not self._stop.wait(self.tick_s):
            if self.cancel.is_set():
                with self._lock:
                    resp = self._resp
                if resp is not None:
                    _abort(resp)
            self._emit()

    # ------------------------------------------------------------------ plan
    def _plan(self) -> tuple[RepoListing, list[RemoteFile]]:
        listing = hub.list_repo(self.repo_id, revision=self.revision, token=self.token,
                                timeout_s=self.read_timeout_s)
        files = [f for f in listing.files if needed_file(f.path)]
        if not any(f.path.endswith(".safetensors") for f in files):
            raise HubError(f"{self.repo_id} has no .safetensors weights at the top level; "
                           "MTP Chat cannot use it")
        if not any(f.path == "config.json" for f in files):
            raise HubError(f"{self.repo_id} has no config.json")
        # Small files first: the model's identity is known early, big files stream last.
        files.sort(key=lambda f: (f.path.endswith(".safetensors"), f.path))
        return listing, files

    def _reconcile(self, listing: RepoListing, files: list[RemoteFile]) -> int:
        """Drop leftovers that do not match the listing; return bytes already on disk."""
        manifest_path = self.staging / MARKER_DIR / MANIFEST_FILE
        old = {}
        with contextlib.suppress(OSError, ValueError):
            import json

            old = {f["path"]: f for f in json.loads(manifest_path.read_text())["files"]}
        have = 0
        for f in files:
            final, part = self.staging / f.path, self.staging / (f.path + ".part")
            prev = old.get(f.path)
            same = prev is not None and prev.get("size") == f.size and \
                prev.get("digest") == _expected_digest(f)
            if not same:
                final.unlink(missing_ok=True)
                part.unlink(missing_ok=True)
            if final.is_file() and final.stat().st_size == f.size:
                have += f.size
                part.unlink(missing_ok=True)
            elif part.is_file():
                if part.stat().st_size > f.size:
                    part.unlink()
                else:
                    have += part.stat().st_size
        write_json_atomic(manifest_path, {
            "repo_id": self.repo_id, "revision": self.revision, "commit": listing.commit,
            "name": self.name, "updated_at": time.time(),
            "files": [{"path": f.path, "size": f.size, "digest": _expected_digest(f)}
                      for f in files]})
        return have

    def _preflight(self, total: int, have: int) -> None:
        extra = self.extra_disk_bytes
        extra = extra(total) if callable(extra) else extra
        need = int((total - have) * DISK_MARGIN) + int(extra)
        free = self.free_space(self.store.root)
        if need > free:
            raise NotEnoughDiskError(
                f"not enough disk space for {self.repo_id}: {format_bytes(need)} needed, "
                f"{format_bytes(free)} free on the disk holding {self.store.root} — free some "
                "space or choose another models folder (nothing was downloaded)")

    # ------------------------------------------------------------------ transfer
    def _fetch_file(self, f: RemoteFile, commit: str) -> None:
        final, part = self.staging / f.path, self.staging / (f.path + ".part")
        final.parent.mkdir(parents=True, exist_ok=True)
        for integrity_try in range(2):
            have = part.stat().st_size if part.exists() else 0
            self._update(file=f.path, file_bytes_total=f.size, file_bytes_done=have)
            self._hash = _hasher(f)
            if self._hash is not None and have:
                with open(part, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 22), b""):
                        self._hash.update(block)
            self._transfer(f, commit, part, have)
            digest = self._hash.hexdigest() if self._hash is not None else None
            if digest is None or digest.lower() == str(_expected_digest(f)).lower():
                os.replace(part, final)
                return
            log.warning("%s: hash mismatch (try %d)", f.path, integrity_try + 1)
            part.unlink(missing_ok=True)
            with self._lock:
                self._state = replace(self._state, bytes_done=self._state.bytes_done - f.size,
                                      file_bytes_done=0)
            self._update(message=f"{f.path} failed its integrity check; downloading it again")
        raise IntegrityError(
            f"{f.path} of {self.repo_id} does not match the checksum the Hub advertised (twice); "
            "the file is corrupt on the server or was altered in transit — nothing was installed")

    def _transfer(self, f: RemoteFile, commit: str, part: Path, have: int) -> None:
        """Bring ``part`` to ``f.size`` bytes, retrying transfer problems with backoff."""
        failures = 0
        while have < f.size or not part.exists():
            if self.cancel.is_set():
                raise Cancelled
            before = have
            try:
                have = self._stream(f, commit, part, have)
            except _Retryable as exc:
                have = part.stat().st_size if part.exists() else 0
                failures = 0 if have > before else failures + 1
                if failures > self.max_retries:
                    raise hub.HubNetworkError(
                        f"giving up on {f.path} after {self.max_retries} retries: {exc}; "
                        "the part already downloaded is kept — retry to resume") from None
                self._update(retries=self._state.retries + 1,
                             message=f"retrying {f.path} ({max(failures, 1)}/"
                                     f"{self.max_retries}): {exc}")
                delay = min(self.retry_backoff_s * 2 ** max(failures - 1, 0), 30.0)
                if self.cancel.wait(delay):
                    raise Cancelled from None

    def _stream(self, f: RemoteFile, commit: str, part: Path, have: int) -> int:
        """Append the rest of ``f`` to ``part`` (keeping the hash in step); return its size."""
        from huggingface_hub.utils import get_session, hf_raise_for_status

        hdrs = hub.headers(self.token)
        if have:
            hdrs["Range"] = f"bytes={have}-"
        url = hub.file_url(self.repo_id, f.path, commit)
        try:
            with get_session().stream("GET", url, headers=hdrs, follow_redirects=True,
                                      timeout=hub.timeout(self.read_timeout_s)) as resp:
                if resp.status_code == 416:
                    raise IntegrityError(f"{f.path}: the server has fewer bytes than the "
                                         f"{f.size} it advertised")
                if resp.status_code >= 400:
                    resp.read()  # so the error parser can show the server's message
                hf_raise_for_status(resp)
                if have and resp.status_code != 206:  # Range ignored: start over
                    have = self._restart_part(part, have, f)
                with self._lock:
                    self._resp = resp
                return self._copy_body(resp, f, part, have)
        except (IntegrityError, NotEnoughDiskError, Cancelled, _Retryable):
            raise
        except Exception as exc:  # noqa: BLE001 - classified below
            if self.cancel.is_set():
                raise Cancelled from None
            err = hub.translate_error(exc, repo_id=self.repo_id, revision=self.revision)
            if isinstance(err, hub.HubOfflineError) or not isinstance(
                    err, (hub.HubNetworkError, hub.HubServerError)):
                raise err from exc
            raise _Retryable(str(err)) from exc
        finally:
            with self._lock:
                self._resp = None

    def _restart_part(self, part: Path, have: int, f: RemoteFile) -> int:
        part.unlink(missing_ok=True)
        with self._lock:
            self._state = replace(self._state, bytes_done=self._state.bytes_done - have,
                                  file_bytes_done=0)
        self._hash = _hasher(f)
        return 0

    def _copy_body(self, resp, f: RemoteFile, part: Path, have: int) -> int:
        h = self._hash
        with open(part, "ab") as fh:
            try:
                for chunk in resp.iter_raw():  # as received: a drop loses nothing
                    if self.cancel.is_set():
                        raise Cancelled
                    if have + len(chunk) > f.size:
                        raise IntegrityError(f"{f.path}: the server sent more than the "
                                             f"{f.size} bytes it advertised")
                    fh.write(chunk)
                    if h is not None:
                        h.update(chunk)
                    have += len(chunk)
                    self._add_bytes(len(chunk))
            except OSError as exc:
                fh.flush()
                os.truncate(part, have)  # drop a half-written chunk; the hash covers `have`
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise NotEnoughDiskError(
                        f"the disk filled up while downloading {f.path}; free some space and "
                        "retry — the part already downloaded is kept") from exc
                raise
        if have < f.size:
            raise _Retryable(f"connection closed after {have} of {f.size} bytes")
        return have

    # ------------------------------------------------------------------ run
    def run(self) -> DownloadResult:
        """Download, verify and install. Returns status "installed" or "cancelled"; raises
        HubError subclasses (the partial download is kept for a later resume)."""
        t0 = time.monotonic()
        self.store.ensure()
        lock = self.store.try_lock(self.name)
        if lock is None:
            raise HubError(f"{self.repo_id} is already being downloaded by another process")
        monitor = threading.Thread(target=self._monitor, name="download-monitor", daemon=True)
        monitor.start()
        try:
            return self._run(t0)
        except Cancelled:
            self._update(phase="cancelled", message="cancelled — the part downloaded is kept")
            return DownloadResult(self.repo_id, self.name, "cancelled", None,
                                  self._state.bytes_total, self._fetched,
                                  self._state.resumed_bytes, time.monotonic() - t0)
        except HubError as exc:
            self._update(phase="failed", message=str(exc))
            raise
        finally:
            self._stop.set()
            monitor.join(timeout=5)
            lock.close()

    def _run(self, t0: float) -> DownloadResult:
        self._update(phase="planning", message="listing files")
        listing, files = self._plan()
        done = self._up_to_date(listing, files, t0)
        if done is not None:
            return done
        self.staging.mkdir(parents=True, exist_ok=True)
        total = sum(f.size for f in files)
        have = self._reconcile(listing, files)
        self._update(bytes_total=total, bytes_done=have, resumed_bytes=have,
                     files_total=len(files), message="")
        self._preflight(total, have)
        self._last_byte = time.monotonic()
        self._update(phase="downloading")
        for i, f in enumerate(files):
            if self.cancel.is_set():
                raise Cancelled
            if f.path.endswith(".safetensors") and i and not files[i - 1].path.endswith(
                    ".safetensors"):
                self._check_config()  # before the first (large) weight file
            if not (self.staging / f.path).is_file():
                self._fetch_file(f, listing.commit)
            self._update(files_done=i + 1, file=f.path, file_bytes_done=f.size,
                         file_bytes_total=f.size)
        self._update(phase="verifying", message="checking files")
        record = self._record(listing, files)
        self._update(phase="installing", message="installing")
        dest = self.store.install(self.staging, self.name, record)
        self._update(phase="done", message=f"installed in {dest}")
        return DownloadResult(self.repo_id, self.name, "installed", str(dest), total,
                              self._fetched, have, time.monotonic() - t0)

    def _up_to_date(self, listing: RepoListing, files: list[RemoteFile], t0: float
                    ) -> DownloadResult | None:
        """A result without fetching anything when ``self.name`` is installed from what the Hub
        lists now (see ``_same_install``) and its files still have their recorded sizes."""
        dest = self.store.path_for(self.name)
        marker = self.store.installed_marker(dest) if dest.is_dir() else None
        if not marker or not self._same_install(marker, listing, files) or \
                not _sizes_match(dest, marker["files"]):
            return None
        total = sum(f.size for f in files)
        self._update(phase="done", bytes_total=total, bytes_done=total, resumed_bytes=total,
                     files_total=len(files), files_done=len(files),
                     message=f"already installed (up to date) in {dest}")
        log.info("%s is already installed from commit %s in %s", self.repo_id,
                 listing.commit, dest)
        return DownloadResult(self.repo_id, self.name, "installed", str(dest), total, 0, total,
                              time.monotonic() - t0, up_to_date=True)

    def _same_install(self, marker: dict, listing: RepoListing, files: list[RemoteFile]) -> bool:
        """The install record lists the same files with the same sizes, and either the same
        commit or, file for file, the same Hub hashes (a new commit that changed no file)."""
        recorded = marker.get("files")
        if marker.get("repo_id") != self.repo_id or not isinstance(recorded, dict):
            return False
        if set(recorded) != {f.path for f in files}:
            return False
        for f in files:
            rec = recorded[f.path] if isinstance(recorded[f.path], dict) else {}
            if rec.get("size") != f.size:
                return False
        if marker.get("commit") == listing.commit:
            return True
        return all(_expected_digest(f) and recorded[f.path].get("digest") == _expected_digest(f)
                   for f in files)

    def _check_config(self) -> None:
        try:
            read_config(self.staging)
        except ModelLoadError as exc:
            self._refuse(exc)

    def _refuse(self, why: ModelLoadError | str):
        import shutil

        shutil.rmtree(self.staging, ignore_errors=True)
        raise hub.UnusableModelError(
            f"{self.repo_id} cannot be used by MTP Chat: {why} Nothing was installed.")

    def _record(self, listing: RepoListing, files: list[RemoteFile]) -> dict:
        """The install record, after checking the model loads (same checks as the loader)."""
        for f in files:
            p = self.staging / f.path
            if not p.is_file() or p.stat().st_size != f.size:
                raise IntegrityError(f"{f.path} is missing or has the wrong size after download")
        try:
            info = inspect_local(self.staging)
        except ModelLoadError as exc:
            self._refuse(exc)
        if not info["supported"]:
            self._refuse("; ".join(r for r in info["reasons"] if r.startswith(("not ", "cannot"))))
        summary = {k: info.get(k) for k in ("family", "quantization", "has_mtp", "layout",
                                            "parameters", "supported")}
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": listing.commit,
                "endpoint": hub.endpoint(), "summary": summary,
                "files": {f.path: {"size": f.size, "digest": _expected_digest(f)} for f in files}}


def _sizes_match(folder: Path, files) -> bool:
    """Every file an install record lists is in ``folder`` with its recorded size."""
    if not isinstance(files, dict):
        return False
    for rel, meta in files.items():
        p = folder / rel
        size = meta.get("size") if isinstance(meta, dict) else None
        if not p.is_file() or (size is not None and p.stat().st_size != size):
            return False
    return True


def _abort(resp) -> None:
    """Unblock a read waiting on a silent server: shut the socket down under it."""
    import socket

    with contextlib.suppress(Exception):
        stream = resp.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
            return
    with contextlib.suppress(Exception):
        resp.close()


def _free_space(path: Path) -> int:
    from engine.hub.catalog import free_disk

    return free_disk(path)


def format_bytes(n: int) -> str:
    """A byte count for messages: ``"1.23 GB"`` from 100 MB up, else ``"45.6 MB"``."""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def download(repo_id: str, **kw) -> DownloadResult:
    """Convenience wrapper: ``Downloader(repo_id, **kw).run()``."""
    return Downloader(repo_id, **kw).run()

