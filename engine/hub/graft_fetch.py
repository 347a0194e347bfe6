"""Fetch only the MTP head's bytes: HTTP Range requests for the ``mtp.*`` spans of each shard.

The spans come from the source's safetensors headers (``graft_source.read_source``): each
shard's ``mtp.*`` tensors, sorted by offset, contiguous ones merged into one request (never
a byte between them). Each span downloads into ``<work>/NNNN.part`` through huggingface_hub's
URL and session (``HF_ENDPOINT``, the token, proxies), appending from the byte reached after
a dropped connection, a cancel or a killed process; a finished span is renamed ``NNNN.span``
and its sha256 recorded in ``<work>/manifest.json`` (checked again on resume). The manifest
pins the source's commit and spans: a rerun for another commit starts afresh.

Integrity: every span must have exactly the length its header promises; where the header and
the spans together make up a whole shard, the shard's sha256 (the Hub's LFS oid) is checked
too — the Hub publishes hashes of whole files only, not of ranges.

:func:`assemble` writes the fetched tensors as one safetensors file with the source's exact
bytes, names, dtypes and shapes.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import HubError
from engine.hub import client as hub
from engine.hub.graft_source import Source

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
Progress = Callable[[int, int, int, str], None]  # done, total, resumed, message


class FetchCancelled(HubError):
    """The user cancelled; what was fetched is kept for the next run."""


@dataclass(frozen=True)
class Span:
    file: str
    start: int          # absolute byte offset in the shard
    end: int            # exclusive
    tensors: tuple[str, ...]

    @property
    def size(self) -> int:
        return self.end - self.start


def plan_spans(source: Source) -> list[Span]:
    """The head's byte spans, contiguous tensors merged, in (file, offset) order."""
    items = []
    for name in source.head_names:
        shard = source.shards[source.tensor_file[name]]
        a, b = shard.tensors[name]["data_offsets"]
        items.append((shard.path, shard.header_len + a, shard.header_len + b, name))
    spans: list[Span] = []
    for path, a, b, name in sorted(items):
        last = spans[-1] if spans else None
        if last is not None and last.file == path and last.end == a:
            spans[-1] = Span(path, last.start, b, last.tensors + (name,))
        else:
            spans.append(Span(path, a, b, (name,)))
    return spans


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class SpanFetcher:
    """Fetch ``spans`` of ``source`` into ``work`` (resumable). Call :meth:`run`."""

    def __init__(self, source: Source, spans: list[Span], work: Path, *, token: str | None,
                 progress: Progress | None = None, cancel: threading.Event | None = None,
                 max_retries: int = 5, retry_backoff_s: float = 0.5,
                 read_timeout_s: float = 60.0) -> None:
        self.source, self.spans, self.work = source, spans, work
        self.token = token
        self.progress = progress or (lambda *a: None)
        self.cancel = cancel or threading.Event()
        self.max_retries, self.retry_backoff_s = max_retries, retry_backoff_s
        self.read_timeout_s = read_timeout_s
        self.total = sum(s.size for s in spans)
        self.fetched = 0      # bytes this run downloaded
        self.resumed = 0      # bytes found from an earlier run
        self._done = 0
        self._last_emit = 0.0

    # ------------------------------------------------------------------ manifest
    def _identity(self) -> dict:
        return {"repo_id": self.source.repo_id, "commit": self.source.commit,
                "spans": [[s.file, s.start, s.end] for s in self.spans]}

    def _load_manifest(self) -> dict:
        from engine.hub.store import write_json_atomic

        path = self.work / MANIFEST
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if {k: data.get(k) for k in ("repo_id", "commit", "spans")} != self._identity():
            for p in self.work.glob("*.part"):
                p.unlink()
            for p in self.work.glob("*.span"):
                p.unlink()
            data = {**self._identity(), "done": {}}
            self.work.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, data)
        return data

    def span_path(self, i: int) -> Path:
        return self.work / f"{i:04d}.span"

    # ------------------------------------------------------------------ run
    def run(self) -> list[Path]:
        """Every span on disk, verified; returns their paths in order."""
        from engine.hub.store import write_json_atomic

        self.work.mkdir(parents=True, exist_ok=True)
        manifest = self._load_manifest()
        done = manifest.setdefault("done", {})
        for i, span in enumerate(self.spans):
            final = self.span_path(i)
            if final.is_file() and final.stat().st_size == span.size \
                    and done.get(str(i)) == _sha256(final):
                self.resumed += span.size
                self._add(span.size, emit=False)
                continue
            final.unlink(missing_ok=True)
            self._fetch(i, span)
            done[str(i)] = _sha256(self.work / f"{i:04d}.part")
            os.replace(self.work / f"{i:04d}.part", final)
            write_json_atomic(self.work / MANIFEST, manifest)
        self._check_whole_files()
        self.progress(self._done, self.total, self.resumed, "fetched")
        return [self.span_path(i) for i in range(len(self.spans))]

    def _add(self, n: int, *, emit: bool = True) -> None:
        self._done += n
        now = time.monotonic()
        if emit and now - self._last_emit > 0.1:
            self._last_emit = now
            self.progress(self._done, self.total, self.resumed, "downloading")

    def _fetch(self, i: int, span: Span) -> None:
        part = self.work / f"{i:04d}.part"
        have = part.stat().st_size if part.exists() else 0
        if have > span.size:
            part.unlink()
            have = 0
        self.resumed += have
        self._add(have, emit=False)
        failures = 0
        while have < span.size:
            if self.cancel.is_set():
                raise FetchCancelled("cancelled; run the same graft again to resume")
            before = have
            try:
                have = self._stream(span, part, have)
            except (hub.HubNetworkError, hub.HubServerError) as exc:
                if isinstance(exc, hub.HubOfflineError):
                    raise
                have = part.stat().st_size if part.exists() else 0
                failures = 0 if have > before else failures + 1
                if failures > self.max_retries:
                    raise hub.HubNetworkError(
                        f"giving up on {span.file} after {self.max_retries} retries: {exc}; "
                        "what was fetched is kept — run the graft again to resume") from None
                if self.cancel.wait(min(self.retry_backoff_s * 2 ** max(failures - 1, 0), 30)):
                    raise FetchCancelled("cancelled; run the same graft again to resume") \
                        from None

    def _stream(self, span: Span, part: Path, have: int) -> int:
        from huggingface_hub.utils import get_session, hf_raise_for_status

        hdrs = hub.headers(self.token)
        hdrs["Range"] = f"bytes={span.start + have}-{span.end - 1}"
        url = hub.file_url(self.source.repo_id, span.file, self.source.commit)
        try:
            with get_session().stream("GET", url, headers=hdrs, follow_redirects=True,
                                      timeout=hub.timeout(self.read_timeout_s)) as resp:
                if resp.status_code >= 400:
                    resp.read()
                hf_raise_for_status(resp)
                if resp.status_code != 206:
                    raise hub.IntegrityError(f"{self.source.repo_id} ignored a byte-range request "
                                             f"for {span.file}; a head-only graft needs ranges")
                return self._copy(resp, span, part, have)
        except (HubError, FetchCancelled):
            raise
        except Exception as exc:  # noqa: BLE001 - classified by the client's translator
            raise hub.translate_error(exc, repo_id=self.source.repo_id,
                                      revision=self.source.revision) from exc

    def _copy(self, resp, span: Span, part: Path, have: int) -> int:
        with open(part, "ab") as fh:
            try:
                for chunk in resp.iter_raw():
                    if self.cancel.is_set():
                        raise FetchCancelled("cancelled; run the same graft again to resume")
                    if have + len(chunk) > span.size:
                        raise hub.IntegrityError(f"{span.file}: the server sent more than the "
                                                 f"{span.size} bytes asked for")
                    fh.write(chunk)
                    have += len(chunk)
                    self.fetched += len(chunk)
                    self._add(len(chunk))
            finally:
                fh.flush()
        if have < span.size:
            raise hub.HubNetworkError(f"connection closed after {have} of {span.size} bytes")
        return have

    def _check_whole_files(self) -> None:
        """sha256 of each shard made up entirely of its header and fetched spans."""
        for path, shard in self.source.shards.items():
            mine = [(i, s) for i, s in enumerate(self.spans) if s.file == path]
            if not mine or not shard.sha256:
                continue
            pos, h = shard.header_len, hashlib.sha256(shard.header)
            for i, s in mine:
                if s.start != pos:
                    break
                with open(self.span_path(i), "rb") as fh:
                    for block in iter(lambda fh=fh: fh.read(1 << 22), b""):
                        h.update(block)
                pos = s.end
            else:
                if pos == shard.size and h.hexdigest() != shard.sha256.lower():
                    raise hub.IntegrityError(f"{path} of {self.source.repo_id} does not match "
                                             "the sha256 the Hub advertised; run the graft again")


def assemble(source: Source, spans: list[Span], paths: list[Path], out: Path) -> Path:
    """One safetensors file of the fetched tensors: the source's names, dtypes, shapes, bytes."""
    header: dict = {"__metadata__": {"format": "pt", "source": source.repo_id,
                                     "commit": source.commit}}
    pos = 0
    for span in spans:
        for name in span.tensors:
            meta = source.meta(name)
            shard = source.shards[span.file]
            a, b = meta["data_offsets"]
            off = pos + shard.header_len + a - span.start
            header[name] = {"dtype": meta["dtype"], "shape": meta["shape"],
                            "data_offsets": [off, off + b - a]}
        pos += span.size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        for p in paths:
            with open(p, "rb") as src:
                for block in iter(lambda src=src: src.read(1 << 22), b""):
                    fh.write(block)
    os.replace(tmp, out)
    return out
