"""``pull``: download a model (resumable, see engine.hub.download) and optionally convert it.

Conversion (raw Hugging Face bf16 -> MLX 4/8-bit keeping the MTP head) streams by default:
``engine.hub.stream_convert`` converts each shard as it arrives and deletes the raw one (peak disk:
converted + about one raw shard; a killed pull resumes without redoing finished shards). With
``keep_raw`` the raw download is installed first and ``engine.models.convert.convert`` runs after it;
families the streaming converter does not know (GLM-4.x, DeepSeek-V3, Qwen3-Next) always go
that way (the streaming pull refuses them after reading config.json, before writing anything).
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from engine.errors import HubError
from engine.hub.client import DownloadProgress, DownloadResult
from engine.hub.download import Cancelled, Downloader, ProgressFn
from engine.hub.store import MARKER_DIR, Store
from engine.models.convert import check_options, convert


def pull(repo_id: str, *, revision: str = "main", convert_bits: int | None = None,
         group_size: int = 64, store: Store | None = None, progress: ProgressFn | None = None,
         cancel: threading.Event | None = None, keep_raw: bool = False, **kw) -> DownloadResult:
    """Download ``repo_id`` (resuming), and with ``convert_bits`` convert it to MLX 4/8-bit.

    By default the conversion streams (``engine.hub.stream_convert``): each raw shard is converted
    as it arrives and deleted, so peak disk is the converted size plus about one raw shard.
    With ``keep_raw`` the raw download is installed first and converted afterwards into
    ``<name>-mlx-<bits>bit`` (both kept).
    """
    store = store or Store()
    cancel = cancel or threading.Event()
    convert_fn = convert if convert_bits else None
    if convert_bits:
        check_options(convert_bits, group_size)  # refused before anything is downloaded
    if convert_bits and not keep_raw:
        from engine.hub.stream_convert import NotStreamable, StreamingConvertPull

        try:
            return StreamingConvertPull(repo_id, revision=revision, bits=convert_bits,
                                        group_size=group_size, store=store, progress=progress,
                                        cancel=cancel, **kw).run()
        except NotStreamable:
            pass  # GLM / DeepSeek / Qwen3-Next: the whole download, then convert (below)
    # bf16 -> b-bit shrinks weights about 16 / (b + 0.5) times; reserve room for the output.
    extra = (lambda total: int(total * (convert_bits + 0.5) / 16)) if convert_bits else 0
    dl = Downloader(repo_id, revision=revision, store=store, progress=progress, cancel=cancel,
                    extra_disk_bytes=extra, **kw)
    result = dl.run()
    if result.status != "installed" or convert_fn is None:
        return result
    return _convert(result, convert_fn, bits=convert_bits, group_size=group_size, store=store,
                    progress=progress, cancel=cancel, revision=revision)


def _convert_progress(progress: ProgressFn | None, base: DownloadProgress):
    """Adapt whatever engine.models.convert reports (a fraction, (done, total), or an object)."""
    def report(*args, **kwargs) -> None:
        if progress is None:
            return
        done, total, msg = 0, 0, ""
        if len(args) >= 2 and isinstance(args[0], (int, float)) and isinstance(args[1], str):
            done, total, msg = args[0] * 1000, 1000, args[1]  # (fraction, message)
        elif len(args) >= 2 and all(isinstance(a, (int, float)) for a in args[:2]):
            done, total = args[0], args[1]
        elif args and isinstance(args[0], (int, float)):
            done, total = args[0] * 1000, 1000
        elif args:
            obj = args[0]
            done = getattr(obj, "done", getattr(obj, "bytes_done", 0)) or 0
            total = getattr(obj, "total", getattr(obj, "bytes_total", 0)) or 0
            msg = str(getattr(obj, "message", "") or "")
        msg = msg or str(kwargs.get("message", "") or (args[2] if len(args) > 2 else ""))
        progress(replace(base, phase="converting", bytes_done=int(done), bytes_total=int(total),
                         message=msg or "converting"))
    return report


def _convert(result: DownloadResult, convert_fn, *, bits: int, group_size: int, store: Store,
             progress: ProgressFn | None, cancel: threading.Event, revision: str
             ) -> DownloadResult:
    t0 = time.monotonic()
    src = Path(result.path)
    name = f"{result.name}-mlx-{bits}bit"
    lock = store.try_lock(name)
    if lock is None:
        raise HubError(f"{name} is already being converted or deleted by another process")
    try:
        return _convert_locked(result, convert_fn, src=src, name=name, t0=t0, bits=bits,
                               group_size=group_size, store=store, progress=progress,
                               cancel=cancel, revision=revision)
    finally:
        lock.close()


def _convert_locked(result: DownloadResult, convert_fn, *, src: Path, name: str, t0: float,
                    bits: int, group_size: int, store: Store, progress: ProgressFn | None,
                    cancel: threading.Event, revision: str) -> DownloadResult:
    import shutil

    staging = store.staging_path(name)
    shutil.rmtree(staging, ignore_errors=True)  # a conversion restarts from scratch
    base = DownloadProgress(repo_id=result.repo_id, phase="converting", name=name)
    if progress:
        progress(base)
    try:
        convert_fn(str(src), str(staging), bits=bits, group_size=group_size,
                   progress=_convert_progress(progress, base), cancel=cancel)
        if cancel.is_set():
            raise Cancelled
        from engine.hub.inspection import inspect_local

        info = inspect_local(staging)
        if not info["supported"]:
            raise HubError(f"the converted model does not load: {'; '.join(info['reasons'])}")
        files = {str(p.relative_to(staging)): {"size": p.stat().st_size}
                 for p in staging.rglob("*") if p.is_file() and MARKER_DIR not in p.parts}
        record = {"repo_id": result.repo_id, "revision": revision, "converted_from": result.name,
                  "bits": bits, "group_size": group_size, "files": files,
                  "summary": {k: info.get(k) for k in ("family", "quantization", "has_mtp",
                                                       "layout", "parameters", "supported")}}
        dest = store.install(staging, name, record)
    except Exception as exc:
        if not (isinstance(exc, Cancelled) or cancel.is_set()):
            return _conversion_failed(exc, staging, base, progress, result, bits, src)
        shutil.rmtree(staging, ignore_errors=True)
        if progress:
            progress(replace(base, phase="cancelled", message="conversion cancelled"))
        return replace(result, status="cancelled", name=name, path=None)
    if progress:
        progress(replace(base, phase="done", message=f"installed in {dest}"))
    return replace(result, name=name, path=str(dest), converted=True,
                   seconds=result.seconds + time.monotonic() - t0,
                   notes=(f"original download kept in {src}",))


def _conversion_failed(exc: Exception, staging: Path, base: DownloadProgress,
                       progress: ProgressFn | None, result: DownloadResult, bits: int, src: Path):
    import shutil

    shutil.rmtree(staging, ignore_errors=True)
    if progress:
        progress(replace(base, phase="failed", message=f"conversion failed: {exc}"))
    if isinstance(exc, HubError):
        raise exc
    raise HubError(f"converting {result.name} to {bits}-bit failed: {exc} (the downloaded "
                   f"model is kept in {src})") from exc
