"""Prompt-cache snapshots on disk: reopening a long chat, or restarting the app, resumes the
conversation's decode state instead of prefilling it again.

Layout: ``cache_dir()/prompt-cache/<model key>/<entry>.safetensors`` (the arrays, written by
``mx.save_safetensors``, read by ``mx.load``; nothing is ever unpickled) and ``<entry>.json``
(the manifest: format, model key, token count and hash, the cache layout, the scalars). The
model key hashes the model folder's resolved path, its ``config.json``, the name, size and
mtime of every weights file, the dtype and the cache layout; the entry name hashes the model
key and the token prefix.

Contract:
- ``save(snaps)``: only snapshots of at least ``min_tokens`` tokens. Their arrays are sliced
  to the live length and copied to host memory on the caller's thread (later decoding cannot
  change them) and queued. One background thread writes the queue: temp file +
  ``os.replace``, the manifest last (it is the commit marker).
- The writer runs while nothing decodes: a decoder says every step whether a decode or a
  prefill runs or waits (``note_busy(bool)``), and the writer waits until ``IDLE_S`` after
  the last busy step (or until a snapshot waited ``MAX_WAIT_S``), pausing between
  ``CHUNK_BYTES`` pieces of a file. A write beside a decode cost it about a
  third of its speed on a 2-core machine. A conversation's newest reply replaces its queued
  snapshots (``Snapshot.lineage``), so a busy conversation queues one turn's. Past
  ``MAX_PENDING_BYTES`` queued, the writer writes even while a decode runs (memory stays
  bounded; a snapshot of a real model at long context can be larger than the bound alone).
  ``flush()`` writes the queue now, decoding or not; at exit the queue is flushed (10 s at
  most per cache).
- ``load(prompt, longer_than=n)``: the entry whose tokens are the longest prefix of ``prompt``
  (longer than ``n``) as a ``Snapshot``, queued or on disk, or None. A file that does not
  read or does not fit (corrupt, truncated, another layout or model) is removed and ignored:
  never an exception.
- The entries of every model together stay under ``max_bytes``: the least recently used
  (manifest mtime, touched on each hit) are removed first.
- ``from_env(...)``: None when ``MTPCHAT_PROMPT_DISK_CACHE=0``; ``MTPCHAT_PROMPT_DISK_CACHE_MB``
  bounds the size (default 4096), ``MTPCHAT_PROMPT_DISK_CACHE_MIN_TOKENS`` sets the shortest
  prompt saved (default 1024).

Imports only ``engine.paths`` and ``engine.decoding.session`` from the engine.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from engine.decoding.session import Snapshot
from engine.paths import weights_identity

log = logging.getLogger(__name__)

FORMAT = 1
DEFAULT_MB = 4096
DEFAULT_MIN_TOKENS = 1024
STALE_TMP_S = 600  # a temp file older than this belongs to a writer that died
IDLE_S = 0.3                # the writer waits until no decode ran for this long
MAX_WAIT_S = 120.0          # ... or until a snapshot waited this long
MAX_PENDING_BYTES = 512 << 20  # queued copies past this are written even while decoding
CHUNK_BYTES = 8 << 20       # a file is written in pieces of this size, pausing for decodes

_LIVE: "weakref.WeakSet[DiskPromptCache]" = weakref.WeakSet()

_DTYPES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.float64: "F64",
           mx.int8: "I8", mx.int16: "I16", mx.int32: "I32", mx.int64: "I64",
           mx.uint8: "U8", mx.uint16: "U16", mx.uint32: "U32", mx.uint64: "U64",
           mx.bool_: "BOOL"}


@dataclass
class _Job:
    """A snapshot copied to host memory, waiting to be written."""

    name: str
    arrays: dict        # name -> (numpy array, safetensors dtype)
    meta: dict
    n: int
    th: str
    queued: float
    lineage: int = 0    # the conversation (``Snapshot.lineage``; 0: none)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a, _ in self.arrays.values())

    def snapshot(self, kinds: dict) -> Snapshot:
        return decode_snapshot({k: _device_copy(a, t) for k, (a, t) in self.arrays.items()},
                               self.meta, kinds)


def _host_copy(a: mx.array) -> tuple[np.ndarray, str]:
    """A numpy copy of ``a`` and its safetensors dtype (bfloat16 travels as its bits)."""
    tag = _DTYPES[a.dtype]
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.array(a, copy=True), tag


def _device_copy(a: np.ndarray, tag: str) -> mx.array:
    out = mx.array(a)
    return out.view(mx.bfloat16) if tag == "BF16" else out


def write_safetensors(path: Path, arrays: dict, *, pause=None) -> None:
    """Write ``arrays`` (name -> (numpy array, safetensors dtype)) as a safetensors file
    (what ``mx.load`` reads), in pieces of ``CHUNK_BYTES``, calling ``pause()`` between them."""
    header, offset = {}, 0
    for name, (a, tag) in arrays.items():
        header[name] = {"dtype": tag, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for a, _ in arrays.values():
            data = memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
            for i in range(0, len(data), CHUNK_BYTES):
                if pause is not None and i:
                    pause()
                f.write(data[i:i + CHUNK_BYTES])
            if pause is not None:
                pause()


@atexit.register
def _flush_all() -> None:
    """At exit, write what is queued (bounded: a stuck disk never holds the exit)."""
    for cache in list(_LIVE):
        cache.flush(timeout=10.0)


def cache_kinds(cache: list | None) -> list:
    """The layout of a cache list: ["kv"] per attention layer, ["arr", n] per array cache."""
    if cache is None:
        return []
    return [["kv"] if hasattr(c, "offset") and hasattr(c, "keys") else ["arr", len(c.cache)]
            for c in cache]


def model_key(path: str, dtype: str, kinds: list) -> str:
    """A hash of the model's identity: folder, config, weights files (name, size, mtime)."""
    folder = Path(path).resolve()
    h = hashlib.sha256(json.dumps([str(folder), dtype, kinds]).encode())
    h.update(weights_identity(folder))
    return h.hexdigest()[:32]


def token_hash(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()


def _state_arrays(prefix: str, state: list | None, out: dict) -> list:
    """Add a cache state's live arrays to ``out``; returns its layout for the manifest."""
    layout = []
    for i, s in enumerate(state or []):
        if s[0] == "kv":
            off = int(s[3])
            if s[1] is not None and off:
                out[f"{prefix}{i}.k"] = s[1][..., :off, :]
                out[f"{prefix}{i}.v"] = s[2][..., :off, :]
            layout.append(["kv", off])
        else:
            present = [a is not None for a in s[1]]
            for j, a in enumerate(s[1]):
                if a is not None:
                    out[f"{prefix}{i}.{j}"] = a
            layout.append(["arr", present])
    return layout


def _state_from(prefix: str, layout: list, kinds: list, arrays: dict) -> list:
    """The cache state of ``layout`` (checked against the model's ``kinds``)."""
    if len(layout) != len(kinds):
        raise ValueError("cache layout does not match the model")
    state = []
    for i, (lay, kind) in enumerate(zip(layout, kinds)):
        if lay[0] != kind[0]:
            raise ValueError("cache kind does not match the model")
        if lay[0] == "kv":
            off = int(lay[1])
            k, v = arrays.get(f"{prefix}{i}.k"), arrays.get(f"{prefix}{i}.v")
            if off and (k is None or v is None or k.shape[2] != off or v.shape[2] != off):
                raise ValueError("attention cache length does not match its offset")
            state.append(("kv", k, v, off))
        else:
            if len(lay[1]) != kind[1]:
                raise ValueError("array cache size does not match the model")
            state.append(("arr", [arrays[f"{prefix}{i}.{j}"] if p else None
                                  for j, p in enumerate(lay[1])]))
    return state


def content_hash(tokens, media: tuple = ()) -> str:
    """``token_hash`` of the tokens, and of the images in them when there are any (each
    (start, tokens, digest)): two prompts with the same ids but other pixels never share an
    entry; a text-only prompt's hash is its token hash, as before."""
    th = token_hash(tokens)
    if not media:
        return th
    return hashlib.sha256((th + json.dumps([list(m) for m in media])).encode()).hexdigest()


def prefix_media(media: tuple, n: int) -> tuple | None:
    """The images of the first ``n`` tokens (None when one is cut at ``n``)."""
    if any(start < n < start + tokens for start, tokens, _ in media):
        return None
    return tuple(tuple(m) for m in media if m[0] < n)


def encode(snap: Snapshot) -> tuple[dict, dict]:
    """(arrays, manifest fields) of a snapshot; the arrays are lazy slices."""
    arrays = {"tokens": mx.array(np.asarray(snap.fed, dtype=np.int32))}
    meta = {"trunk": _state_arrays("t", snap.trunk_state, arrays),
            "mtp": None if snap.mtp_state is None else _state_arrays("m", snap.mtp_state, arrays),
            "mtp_rows": snap.mtp_rows, "pending_tok": list(snap.pending_tok),
            "mtp_ok": bool(snap.mtp_ok)}
    if snap.media:
        meta.update(media=[list(m) for m in snap.media], rope_delta=int(snap.rope_delta))
    for name in ("pending_h", "last_hidden", "last_logits"):
        if getattr(snap, name) is not None:
            arrays[name] = getattr(snap, name)
    return arrays, meta


def decode_snapshot(arrays: dict, meta: dict, kinds: dict) -> Snapshot:
    """The snapshot of ``encode``'s output; ValueError/KeyError when it does not fit."""
    fed = tuple(int(t) for t in np.array(arrays["tokens"]).tolist())
    mtp = meta["mtp"]
    if mtp is not None and not kinds["mtp"]:
        mtp = None
    return Snapshot(
        fed=fed, trunk_state=_state_from("t", meta["trunk"], kinds["trunk"], arrays),
        mtp_state=None if mtp is None else _state_from("m", mtp, kinds["mtp"], arrays),
        mtp_rows=int(meta["mtp_rows"]), pending_h=arrays.get("pending_h"),
        pending_tok=tuple(int(t) for t in meta["pending_tok"]),
        last_hidden=arrays.get("last_hidden"), last_logits=arrays.get("last_logits"),
        mtp_ok=bool(meta["mtp_ok"]) and mtp is not None,
        rope_delta=int(meta.get("rope_delta", 0)),
        media=tuple((int(a), int(b), str(c)) for a, b, c in meta.get("media", ())))


def _prefix_matcher(prompt: list[int], media: tuple, longer_than: int, need_mtp: bool):
    """``fits(n, mtp_ok, token_hash)``: whether an entry of ``n`` tokens with that hash is a
    prefix of ``prompt`` (and its images) usable here; each length is hashed once."""
    hashes: dict[int, str | None] = {}

    def fits(n: int, mtp_ok, th) -> bool:
        if not longer_than < n <= len(prompt) or (need_mtp and not mtp_ok):
            return False
        if n not in hashes:
            have = prefix_media(media, n)
            hashes[n] = None if have is None else content_hash(prompt[:n], have)
        return hashes[n] == th

    return fits


class DiskPromptCache:
    """One model's prompt snapshots on disk (see the module docstring)."""

    def __init__(self, root: Path, key: str, kinds: dict, *, max_bytes: int,
                 min_tokens: int, idle_s: float = IDLE_S, max_wait_s: float = MAX_WAIT_S,
                 max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self.root, self.key, self.kinds = Path(root), key, kinds
        self.dir = self.root / key
        self.max_bytes, self.min_tokens = int(max_bytes), int(min_tokens)
        self.idle_s, self.max_wait_s = float(idle_s), float(max_wait_s)
        self.max_pending_bytes = int(max_pending_bytes)
        self._cond = threading.Condition()
        self._pending: dict[str, _Job] = {}   # saved, not yet on disk (oldest first)
        self._writing: _Job | None = None
        self._busy = False                    # a decode or prefill runs (``note_busy``)
        self._last_busy = 0.0                 # monotonic time of the last ``note_busy``
        self._forced = 0                      # flush() calls waiting
        self._writer: threading.Thread | None = None
        self.superseded = 0                   # queued jobs replaced by a newer reply's
        _LIVE.add(self)

    # -- saving ---------------------------------------------------------------------------
    def note_busy(self, busy: bool = True) -> None:
        """Whether a decode or prefill runs now (a decoder calls this every step): the writer
        waits while one does and for ``idle_s`` after it ends."""
        self._busy = bool(busy)
        self._last_busy = time.monotonic()

    def save(self, snaps: list[Snapshot]) -> None:
        """Copy the long enough snapshots not already stored (on this thread: later decoding
        cannot change the copies) and queue them for the writer, which writes while no
        decode runs (``note_busy``)."""
        snaps = [s for s in snaps if s is not None and len(s.fed) >= self.min_tokens
                 and s.last_logits is not None]
        hashes = [content_hash(s.fed, s.media) for s in snaps]
        names = [self._entry_name(th, s.mtp_ok) for s, th in zip(snaps, hashes)]
        self._supersede({s.lineage for s in snaps if s.lineage}, set(names))
        seen = set()
        for snap, name, th in zip(snaps, names, hashes):
            if name in seen:
                continue
            seen.add(name)
            with self._cond:
                if name in self._pending or (self._writing and self._writing.name == name):
                    continue
            have = self._stored(th, snap.mtp_ok)
            if have is not None:
                _touch(have)
                continue
            arrays, meta = encode(snap)
            job = _Job(name, {k: _host_copy(v) for k, v in arrays.items()}, meta,
                       len(snap.fed), th, time.monotonic(), snap.lineage)
            with self._cond:
                self._pending[name] = job
                self._start_writer()
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Write every queued snapshot now, decoding or not; False if ``timeout`` passed."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._forced += 1
            self._cond.notify_all()
            try:
                while self._pending or self._writing is not None:
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._forced -= 1

    def _supersede(self, lineages: set, keep: set) -> None:
        """Drop the queued snapshots of these conversations (lineages) but ``keep``: a
        conversation's newest reply supersedes its earlier ones, so a busy agent session
        queues one turn's states, not every turn's."""
        with self._cond:
            for name in [n for n, j in self._pending.items()
                         if j.lineage in lineages and n not in keep]:
                del self._pending[name]
                self.superseded += 1

    def _queued_bytes(self) -> int:
        """Bytes of the queued copies and the one being written (held with ``_cond``)."""
        jobs = list(self._pending.values()) + ([self._writing] if self._writing else [])
        return sum(j.nbytes for j in jobs)

    def _start_writer(self) -> None:
        if self._writer is None or not self._writer.is_alive():
            self._writer = threading.Thread(target=self._write_loop, name="prompt-disk-cache",
                                            daemon=True)
            self._writer.start()

    def _may_write(self, job: _Job) -> float:
        """0 when ``job`` may be written now, else how long to wait (held with ``_cond``)."""
        if self._forced or self._queued_bytes() > self.max_pending_bytes:
            return 0.0
        now = time.monotonic()
        if now - job.queued >= self.max_wait_s:
            return 0.0
        if self._busy:   # wait for the decoder's next word (or the job's deadline)
            return min(self.idle_s, self.max_wait_s - (now - job.queued))
        return max(0.0, self.idle_s - (now - self._last_busy))

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    if not self._cond.wait(timeout=30.0) and not self._pending:
                        self._writer = None
                        return
                job = next(iter(self._pending.values()))
                wait = self._may_write(job)
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                del self._pending[job.name]
                self._writing = job
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                self._write(job)
                with self._cond:
                    last = not self._pending
                if last:
                    self.evict()
            except Exception as exc:  # noqa: BLE001 - a full disk or a vanished folder only costs a prefill
                log.warning("could not save the prompt cache to %s: %s", self.dir, exc)
                log.debug("prompt cache save failure", exc_info=True)
            finally:
                with self._cond:
                    self._writing = None
                    self._cond.notify_all()

    def _pause(self) -> None:
        """Between chunks of a file: wait while a decode runs (a forced flush never waits)."""
        with self._cond:
            while self._writing is not None:
                wait = self._may_write(self._writing)
                if wait <= 0:
                    return
                self._cond.wait(wait)

    def _write(self, job: _Job) -> None:
        tag = f"{os.getpid()}-{threading.get_ident()}"
        tmp_arr = self.dir / f".{job.name}.{tag}.tmp.safetensors"
        tmp_man = self.dir / f".{job.name}.{tag}.tmp.json"
        try:
            write_safetensors(tmp_arr, job.arrays, pause=self._pause)
            os.replace(tmp_arr, self.dir / f"{job.name}.safetensors")
        except BaseException:
            _unlink(tmp_arr)
            raise
        manifest = dict(job.meta, format=FORMAT, model_key=self.key, n_tokens=job.n,
                        token_hash=job.th)
        tmp_man.write_text(json.dumps(manifest), encoding="utf-8")
        os.replace(tmp_man, self.dir / f"{job.name}.json")

    def evict(self) -> None:
        """Remove stale temp files and orphans, then the least recently used entries until
        every model's entries together fit in ``max_bytes``."""
        entries, now = [], time.time()
        for man in self.root.glob("*/*.json"):
            if man.name.startswith("."):
                continue
            arr = man.with_suffix(".safetensors")
            try:
                entries.append((man.stat().st_mtime, _size(man) + _size(arr), man))
            except OSError:
                continue
        for f in self.root.glob("*/.*.tmp.*"):
            if _age(f, now) > STALE_TMP_S:
                _unlink(f)
        for arr in self.root.glob("*/*.safetensors"):
            if not arr.with_suffix(".json").exists() and _age(arr, now) > STALE_TMP_S:
                _unlink(arr)
        total = sum(e[1] for e in entries)
        for _mtime, size, man in sorted(entries):
            if total <= self.max_bytes:
                break
            _remove_entry(man)
            total -= size

    # -- loading --------------------------------------------------------------------------
    def load(self, prompt: list[int], *, longer_than: int = 0,
             need_mtp: bool = False, media: tuple = ()) -> Snapshot | None:
        """The stored snapshot with the longest prefix of ``prompt`` and its images
        (``media``) (None if none fits): on disk, or queued and not yet written."""
        fits = _prefix_matcher(prompt, media, longer_than, need_mtp)
        found = self._candidates(fits) + self._queued(fits)
        for n, src in sorted(found, key=lambda x: -x[0]):
            if isinstance(src, _Job):
                snap = self._from_job(src, prompt[:n], prefix_media(media, n))
            else:
                snap = self._read(src, prompt[:n], prefix_media(media, n))
                if snap is not None:
                    _touch(src)
            if snap is not None and (not need_mtp or snap.mtp_ok):
                return snap
        return None

    def _queued(self, fits) -> list:
        with self._cond:
            jobs = list(self._pending.values()) + ([self._writing] if self._writing else [])
        return [(job.n, job) for job in jobs if fits(job.n, job.meta["mtp_ok"], job.th)]

    def _from_job(self, job: _Job, tokens: list[int], media: tuple = ()) -> Snapshot | None:
        try:
            snap = job.snapshot(self.kinds)
            if list(snap.fed) != list(tokens) or tuple(snap.media) != tuple(media or ()):
                return None
            return snap
        except Exception:  # noqa: BLE001 - a queued copy that does not fit is only a miss
            log.debug("a queued prompt snapshot did not fit", exc_info=True)
            return None

    def _candidates(self, fits) -> list:
        found = []
        for man in self.dir.glob("*.json") if self.dir.is_dir() else ():
            try:
                meta = json.loads(man.read_text(encoding="utf-8"))
                n = int(meta["n_tokens"])
                ok = meta["format"] == FORMAT and meta["model_key"] == self.key
            except (OSError, ValueError, KeyError, TypeError):
                _remove_entry(man)
                continue
            if not ok:
                _remove_entry(man)
                continue
            if fits(n, meta.get("mtp_ok"), meta.get("token_hash")):
                found.append((n, man))
        return found

    def _read(self, man: Path, tokens: list[int], media: tuple = ()) -> Snapshot | None:
        try:
            meta = json.loads(man.read_text(encoding="utf-8"))
            arrays = mx.load(str(man.with_suffix(".safetensors")))
            mx.eval(list(arrays.values()))
            snap = decode_snapshot(arrays, meta, self.kinds)
            if list(snap.fed) != list(tokens) or snap.last_logits is None or \
                    tuple(snap.media) != tuple(media or ()):
                raise ValueError("the stored tokens are not the manifest's")
            return snap
        except Exception as exc:  # noqa: BLE001 - a bad entry is removed, never fatal
            log.warning("ignoring the prompt cache entry %s: %s", man.name, exc)
            _remove_entry(man)
            return None

    def _entry_name(self, th: str, mtp_ok: bool) -> str:
        """The entry of a snapshot whose ``content_hash`` is ``th``."""
        tag = "mtp" if mtp_ok else "trunk"
        return hashlib.sha256(f"{self.key}{th}{tag}".encode()).hexdigest()[:40]

    def _stored(self, th: str, mtp_ok: bool) -> Path | None:
        """The manifest of an entry as good as a snapshot whose ``content_hash`` is ``th`` (an
        entry with the MTP cache serves every depth; one without serves depth 0 only)."""
        for tag in (True,) if mtp_ok else (True, False):
            man = self.dir / f"{self._entry_name(th, tag)}.json"
            if man.is_file():
                return man
        return None


def from_env(path: str, dtype: str, trunk_cache: list, mtp_cache: list | None,
             *, root: Path | None = None, enabled: bool | None = None) -> DiskPromptCache | None:
    """The model's disk cache with the settings of the environment (None: turned off);
    ``enabled`` overrides ``MTPCHAT_PROMPT_DISK_CACHE``."""
    if enabled is None:
        enabled = os.environ.get("MTPCHAT_PROMPT_DISK_CACHE", "1").strip().lower() not in (
            "0", "off", "false", "no")
    if not enabled:
        return None
    try:
        mb = float(os.environ.get("MTPCHAT_PROMPT_DISK_CACHE_MB", DEFAULT_MB))
        min_tokens = int(os.environ.get("MTPCHAT_PROMPT_DISK_CACHE_MIN_TOKENS", DEFAULT_MIN_TOKENS))
        kinds = {"trunk": cache_kinds(trunk_cache), "mtp": cache_kinds(mtp_cache)}
        if root is None:
            from engine.paths import cache_dir

            root = cache_dir() / "prompt-cache"
        key = model_key(path, dtype, [kinds["trunk"], kinds["mtp"]])
    except (OSError, ValueError) as exc:  # a read-only or full home: decode without it
        log.warning("prompt cache on disk turned off: %s", exc)
        log.debug("why the prompt cache on disk is off", exc_info=True)
        return None
    return DiskPromptCache(root, key, kinds, max_bytes=int(mb * 2**20), min_tokens=min_tokens)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _age(p: Path, now: float) -> float:
    try:
        return now - p.stat().st_mtime
    except OSError:
        return 0.0


def _touch(p: Path) -> None:
    try:
        os.utime(p)
    except OSError:
        pass


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def _remove_entry(man: Path) -> None:
    _unlink(man)
    _unlink(man.with_suffix(".safetensors"))
