"""A fake Hugging Face Hub for offline tests: stdlib ThreadingHTTPServer on 127.0.0.1.

Serves what huggingface_hub and engine.hub.client ask for (see PACKAGING_AND_HUB.md):
``/api/models/{repo}[/revision/{rev}]``, ``/api/models/{repo}/tree/{rev}``, HEAD/GET
``/{repo}/resolve/{rev}/{path}`` with Range support, and Hub-style errors (``X-Error-Code``).

Switches (attributes / methods on :class:`FakeHub`, changeable while it runs):
- ``chunk_size`` / ``chunk_delay_s``: the body is written in chunks with a delay between them;
- ``drop_after(path, nbytes, times=1)``: the next ``times`` GETs of ``path`` close the
  connection after ``nbytes`` body bytes;
- ``fail_with(status, times=1, path=None)``: answer the next GETs of file content with a 5xx;
- ``api_delay_s``: every ``/api/`` answer waits this long (a slow network);
- ``redirect = True``: file GETs answer 302 to a second server (a "CDN" on another port);
- a repo can be gated (401 ``GatedRepo`` without ``Authorization: Bearer <token>``) or
  advertise a wrong sha256 / size for one file (``corrupt``).

``served[(repo, path)]`` counts the body bytes written to sockets; ``requests`` logs every
request as a dict (method, path, range, auth, host).

Run standalone (for screenshots or manual tests): ``python -m tests.fakehub --port 8765``.
"""
from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

VALID_TOKEN = "hf_fake_valid_token"


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated: bool = False
    corrupt: dict[str, dict] = field(default_factory=dict)  # path -> {"sha256"|"size": value}
    lfs_suffixes: tuple[str, ...] = (".safetensors",)
    meta: dict = field(default_factory=dict)  # search answers: downloads, likes, license, tags

    def search_item(self, repo_id: str) -> dict:
        """What ``GET /api/models?search=...&expand=...`` lists for this repo."""
        try:
            config = json.loads(self.files.get("config.json", b"{}"))
        except ValueError:
            config = {}
        size = sum(self.entry(p)["size"] for p in self.files)
        cfg = {k: config[k] for k in ("architectures", "model_type", "quantization")
               if k in config}
        return {"id": repo_id, "modelId": repo_id, "sha": self.sha, "private": False,
                "gated": "manual" if self.gated else False,
                "downloads": self.meta.get("downloads", 0), "likes": self.meta.get("likes", 0),
                "tags": self.meta.get("tags", ["safetensors"]),
                "cardData": {"license": self.meta.get("license", "apache-2.0")},
                "config": cfg, "usedStorage": size,
                "lastModified": "2026-05-01T00:00:00.000Z"}

    @property
    def sha(self) -> str:
        h = hashlib.sha1()
        for p in sorted(self.files):
            h.update(p.encode() + b"\0" + hashlib.sha1(self.files[p]).digest())
        return h.hexdigest()

    def entry(self, path: str) -> dict:
        data = self.files[path]
        git_oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        item = {"type": "file", "path": path, "size": len(data), "oid": git_oid}
        if path.endswith(self.lfs_suffixes):
            sha = hashlib.sha256(data).hexdigest()
            size = len(data)
            bad = self.corrupt.get(path, {})
            item["lfs"] = {"oid": bad.get("sha256", sha), "size": bad.get("size", size),
                           "pointerSize": 134}
            item["size"] = item["lfs"]["size"]
        elif path in self.corrupt:
            item["oid"] = self.corrupt[path].get("oid", "0" * 40)
        return item


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, fmt, *args):  # keep test output clean
        pass

    # -------------------------------------------------------------- helpers
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        hdrs = {"Content-Length": str(len(body)), **(headers or {})}
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(),
                   {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str, msg: str = "") -> None:
        self._send(status, json.dumps({"error": msg or code}).encode(),
                   {"X-Error-Code": code, "X-Error-Message": msg or code,
                    "Content-Type": "application/json"})

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.server.hub.valid_token}"

    def _log(self) -> None:
        hub = self.server.hub
        with hub.lock:
            hub.requests.append({"method": self.command, "path": self.path,
                                 "range": self.headers.get("Range"),
                                 "auth": self.headers.get("Authorization"),
                                 "host": "cdn" if self.server.is_cdn else "hub"})

    # -------------------------------------------------------------- routing
    def do_HEAD(self):  # noqa: N802
        self._route()

    def do_GET(self):  # noqa: N802
        self._route()

    def _route(self) -> None:
        self._log()
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        hub = self.server.hub
        try:
            if self.server.is_cdn:
                return self._cdn(path)
            if path == "/api/models":
                return self._search(parts.query)
            if path.startswith("/api/models/"):
                return self._api(path[len("/api/models/"):], parts.query)
            if "/resolve/" in path:
                repo, rest = path.lstrip("/").split("/resolve/", 1)
                rev, _, fpath = rest.partition("/")
                return self._resolve(repo, rev, fpath)
            self._error(404, "EntryNotFound", "no such route")
        except (BrokenPipeError, ConnectionResetError, OSError):
            hub.note_disconnect()

    def _lookup(self, repo_id: str, rev: str) -> FakeRepo | None:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if rev not in ("main", repo.sha):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo

    def _api(self, rest: str, query: str) -> None:
        hub = self.server.hub
        repo_id, rev, tree_path = rest, "main", None
        if "/tree/" in rest:
            repo_id, tail = rest.split("/tree/", 1)
            rev, _, tree_path = tail.partition("/")
        elif "/revision/" in rest:
            repo_id, rev = rest.split("/revision/", 1)
        repo = self._lookup(repo_id, rev)
        if repo is None:
            return
        if hub.api_status:
            return self._error(hub.api_status, "ServerError", "fake outage")
        if hub.api_delay_s:
            time.sleep(hub.api_delay_s)
        if "/tree/" in rest:
            items = [repo.entry(p) for p in sorted(repo.files)
                     if not tree_path or p.startswith(tree_path.rstrip("/") + "/")]
            return self._json(items)
        self._json({"id": repo_id, "modelId": repo_id, "sha": repo.sha,
                    "gated": "manual" if repo.gated else False, "private": False,
                    "siblings": [{"rfilename": p, "size": repo.entry(p)["size"]}
                                 for p in sorted(repo.files)]})

    def _search(self, query: str) -> None:
        """Hub search: ``search`` matches ids (case-insensitive), most downloaded first, pages
        of ``hub.search_page_size`` linked by ``Link: <...cursor=N>; rel="next"``."""
        from urllib.parse import parse_qs, urlencode

        hub = self.server.hub
        if hub.api_status:
            return self._error(hub.api_status, "ServerError", "fake outage")
        q = parse_qs(query)
        want = (q.get("search") or [""])[0].lower()
        hub.searches.append(q)
        ids = sorted((r for r in hub.repos if want in r.lower()),
                     key=lambda r: (-hub.repos[r].meta.get("downloads", 0), r))
        start = int((q.get("cursor") or ["0"])[0])
        size = min(int((q.get("limit") or [hub.search_page_size])[0]), hub.search_page_size)
        page = ids[start:start + size]
        headers = {}
        if start + size < len(ids):
            nxt = {k: v for k, v in q.items() if k != "cursor"}
            nxt["cursor"] = [str(start + size)]
            headers["Link"] = f'<{hub.url}/api/models?{urlencode(nxt, doseq=True)}>; rel="next"'
        self._json([hub.repos[r].search_item(r) for r in page], headers=headers)

    def _resolve(self, repo_id: str, rev: str, fpath: str) -> None:
        hub = self.server.hub
        repo = self._lookup(repo_id, rev)
        if repo is None:
            return
        if repo.gated and not self._authorized():
            return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted.")
        if fpath not in repo.files:
            return self._error(404, "EntryNotFound", f"{fpath} does not exist")
        entry = repo.entry(fpath)
        etag = (entry.get("lfs") or {}).get("oid") or entry["oid"]
        meta = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if self.command == "GET":
            status = hub.take_failure(fpath)
            if status:
                return self._error(status, "ServerError", "fake server error")
        if hub.redirect and self.command == "GET":
            loc = f"{hub.cdn_url}/cdn/{repo_id}/{repo.sha}/{fpath}?sig=fake"
            return self._send(302, b"", {**meta, "Location": loc,
                                         "X-Linked-Size": str(entry["size"]),
                                         "X-Linked-Etag": f'"{etag}"'})
        self._body(repo_id, fpath, repo.files[fpath], meta)

    def _cdn(self, path: str) -> None:
        # /cdn/{org}/{name}/{sha}/{file}
        bits = path.split("/", 5)
        if len(bits) < 6:
            return self._error(404, "EntryNotFound")
        repo_id, fpath = f"{bits[2]}/{bits[3]}", bits[5]
        repo = self.server.hub.repos.get(repo_id)
        if repo is None or fpath not in repo.files:
            return self._error(404, "EntryNotFound")
        self._body(repo_id, fpath, repo.files[fpath], {"Accept-Ranges": "bytes"})

    # -------------------------------------------------------------- file bodies
    def _body(self, repo_id: str, fpath: str, data: bytes, meta: dict) -> None:
        hub = self.server.hub
        start, end = 0, len(data) - 1
        rng = self.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a) if a else 0
            end = min(int(b), len(data) - 1) if b else len(data) - 1
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            status = 206
            meta = {**meta, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
        body = data[start:end + 1]
        self.send_response(status)
        for k, v in {**meta, "Content-Length": str(len(body)),
                     "Content-Type": "application/octet-stream"}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        drop = hub.take_drop(fpath)
        with hub.lock:
            hub.active += 1
        try:
            self._write_body(repo_id, fpath, body, drop)
        finally:
            with hub.lock:
                hub.active -= 1

    def _write_body(self, repo_id: str, fpath: str, body: bytes, drop: int | None) -> None:
        hub = self.server.hub
        sent = 0
        while sent < len(body):
            n = min(hub.chunk_size, len(body) - sent)
            if drop is not None:
                n = min(n, drop - sent)
                if n <= 0:
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
            self.wfile.write(body[sent:sent + n])
            self.wfile.flush()
            sent += n
            hub.count(repo_id, fpath, n)
            delay = hub.delay_for(fpath)
            if delay:
                time.sleep(delay)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, hub: FakeHub, *, is_cdn: bool, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.hub, self.is_cdn = hub, is_cdn

    def handle_error(self, request, client_address) -> None:
        import sys

        if isinstance(sys.exc_info()[1], OSError):  # a client went away: expected in tests
            self.hub.note_disconnect()
            return
        super().handle_error(request, client_address)


class FakeHub:
    """Start with ``with FakeHub(repos) as hub:``; ``hub.url`` is the endpoint."""

    def __init__(self, repos: dict[str, FakeRepo], *, port: int = 0) -> None:
        self.repos = repos
        self.valid_token = VALID_TOKEN
        self.chunk_size = 64 * 1024
        self.chunk_delay_s = 0.0
        self.path_delay_s: dict[str, float] = {}
        self.redirect = False
        self.api_status = 0
        self.api_delay_s = 0.0  # a slow network for /api/ calls
        self.search_page_size = 3  # small, so tests page through the Link header
        self.searches: list[dict] = []  # the query of every search request
        self.lock = threading.Lock()
        self.served: dict[tuple[str, str], int] = defaultdict(int)
        self.requests: list[dict] = []
        self.disconnects = 0
        self.active = 0  # file bodies being written right now
        self._drops: dict[str, list[int]] = defaultdict(list)
        self._failures: list[tuple[int, str | None]] = []
        self._hub = _Server(self, is_cdn=False, port=port)
        self._cdn = _Server(self, is_cdn=True)
        self._threads: list[threading.Thread] = []

    # -------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def start(self) -> FakeHub:
        for srv in (self._hub, self._cdn):
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for srv in (self._hub, self._cdn):
            srv.shutdown()
            srv.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -------------------------------------------------------------- switches
    def drop_after(self, path: str, nbytes: int, *, times: int = 1) -> None:
        with self.lock:
            self._drops[path].extend([nbytes] * times)

    def fail_with(self, status: int, *, times: int = 1, path: str | None = None) -> None:
        with self.lock:
            self._failures.extend([(status, path)] * times)

    def take_drop(self, path: str) -> int | None:
        with self.lock:
            return self._drops[path].pop(0) if self._drops.get(path) else None

    def take_failure(self, path: str) -> int:
        with self.lock:
            for i, (status, p) in enumerate(self._failures):
                if p is None or p == path:
                    del self._failures[i]
                    return status
        return 0

    def delay_for(self, path: str) -> float:
        return self.path_delay_s.get(path, self.chunk_delay_s)

    def count(self, repo_id: str, path: str, n: int) -> None:
        with self.lock:
            self.served[(repo_id, path)] += n

    def note_disconnect(self) -> None:
        with self.lock:
            self.disconnects += 1

    def served_for(self, repo_id: str) -> dict[str, int]:
        with self.lock:
            return {p: n for (r, p), n in self.served.items() if r == repo_id}

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until no file body is being written (e.g. to a client that went away)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.active == 0:
                    return
            time.sleep(0.01)
        raise TimeoutError("the fake hub is still sending")

    def reset_counts(self) -> None:
        with self.lock:
            self.served.clear()
            self.requests.clear()


# ------------------------------------------------------------------ test helpers

def point_hf_at(hub: FakeHub, monkeypatch, tmp_path: Path) -> None:
    """Aim huggingface_hub (in this process) at ``hub``: online, no token, a fresh app home."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)


def subprocess_env(hub: FakeHub, home: Path, **extra: str) -> dict[str, str]:
    """Environment for a child process (HF_ENDPOINT is read at import, so set it here)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN",)}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1",
               HF_HOME=str(home / "hf"), MTPCHAT_HOME=str(home), **extra)
    return env


# ------------------------------------------------------------------ tiny repos

def _read_dir(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def tiny_repos(workdir: str | Path, *, shards: int = 2) -> dict[str, FakeRepo]:
    """Build the standard set: tiny/mtp, tiny/no-mtp, tiny/gated, tiny/corrupt, tiny/llama."""
    from tests.tinymodels import build_tiny_model

    workdir = Path(workdir)
    mtp = _read_dir(build_tiny_model(workdir / "mtp", shards=shards))
    no_mtp = _read_dir(build_tiny_model(workdir / "no-mtp", with_mtp=False, seed=1))
    repos = {
        "tiny/mtp": FakeRepo(dict(mtp)),
        "tiny/no-mtp": FakeRepo(no_mtp),
        "tiny/gated": FakeRepo(dict(mtp), gated=True),
    }
    corrupt = dict(mtp)
    victim = sorted(p for p in corrupt if p.endswith(".safetensors"))[-1]
    repos["tiny/corrupt"] = FakeRepo(corrupt, corrupt={victim: {"sha256": "0" * 64}})
    llama = {"config.json": json.dumps({"architectures": ["LlamaForCausalLM"],
                                        "model_type": "llama"}).encode()}
    llama["model.safetensors"] = mtp[sorted(p for p in mtp if p.endswith(".safetensors"))[0]]
    repos["tiny/llama"] = FakeRepo(llama)
    return repos


def main() -> None:  # pragma: no cover - manual use
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="serve tiny fake Hub repos on 127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds between 64 KiB chunks")
    args = ap.parse_args()
    hub = FakeHub(tiny_repos(tempfile.mkdtemp()), port=args.port)
    hub.chunk_delay_s = args.delay
    with hub:
        print(f"fake hub at {hub.url} (repos: {', '.join(hub.repos)}); Ctrl+C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":  # pragma: no cover
    main()
