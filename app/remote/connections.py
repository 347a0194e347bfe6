"""Saved connections to OpenAI-compatible servers, and the "Test connection" probe (no Qt).

A ``Connection`` is a base URL (``http://host:port/v1``), an optional API key and what the
last probe found: the server's model ids and its ``kind`` ("mtp" for an MTP Chat server,
whose replies carry ``mtp`` speculation stats; "openai" for any other). They are kept in
``connections.json`` in the app's config folder, readable by the user only; the key is never
logged (``Connection`` leaves it out of its repr) and the UI shows it masked.

A model of a connection is chosen like a model folder: its "path" is
``remote+<base URL>#<model id>`` (``remote_path`` / ``parse_remote_path``), and its
``ModelInfo`` (``remote_info``) has layout "remote".
"""
from __future__ import annotations

import json
import logging
import os
import ssl
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from engine.types import ModelInfo

log = logging.getLogger(__name__)
PREFIX = "remote+"
PROBE_TIMEOUT_S = 5.0
FILE_NAME = "connections.json"


class RemoteError(Exception):
    """A one-line, actionable description of what is wrong with a server or a reply."""


@dataclass(frozen=True)
class Connection:
    base_url: str
    api_key: str = field(default="", repr=False)
    models: tuple[str, ...] = ()
    kind: str = "openai"  # "mtp": an MTP Chat server (its replies carry ``mtp`` stats)

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc or self.base_url


def normalize_url(text: str) -> str:
    """``host:port``, ``http://host:port`` or ``.../v1`` -> ``http://host:port/v1``; a
    ``RemoteError`` for what is not an http(s) URL."""
    text = text.strip().rstrip("/")
    if not text:
        raise RemoteError("Enter the server's address, e.g. http://192.168.1.20:8080")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"Not an http(s) address: {text}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise RemoteError(f"Not a valid port in {text}") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def remote_path(conn: Connection, model: str) -> str:
    return f"{PREFIX}{conn.base_url}#{model}"


def is_remote(path: str | None) -> bool:
    return bool(path) and str(path).startswith(PREFIX)


def parse_remote_path(path: str) -> tuple[str, str]:
    """(base URL, model id) of a ``remote_path``."""
    base, _, model = str(path)[len(PREFIX):].partition("#")
    return base, model


def remote_info(conn: Connection, model: str) -> ModelInfo:
    """What the app's views show about a served model (sizes unknown: zero)."""
    mtp = conn.kind == "mtp"
    return ModelInfo(
        path=remote_path(conn, model), name=model, architecture="remote", family="remote",
        layout="remote", num_parameters=0, bytes_on_disk=0, quantization=None,
        has_mtp=mtp, mtp_layers=0, max_depth=6 if mtp else 0, context_length=0,
        vocab_size=0, hidden_size=0, num_layers=0, dtype="", eos_token_ids=(),
        supports_thinking=mtp)


def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def explain(exc: BaseException, url: str, *, timeout: float = PROBE_TIMEOUT_S) -> str:
    """One line for a transport failure talking to ``url``."""
    host = urlsplit(url).netloc or url
    text = str(exc)
    if isinstance(exc, httpx.TimeoutException):
        return f"No answer from {host} within {timeout:g} s (timeout): is the address right?"
    if isinstance(exc, ssl.SSLError) or "SSL" in text or "certificate" in text.lower():
        return f"TLS error talking to {host}: {text.splitlines()[0][:160]}"
    if isinstance(exc, httpx.ConnectError):
        if "refused" in text.lower() or "Errno 111" in text:
            return f"Connection refused by {host}: is the server running on that port?"
        return f"Cannot reach {host}: {text.splitlines()[0][:160] if text else 'no route'}"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return f"The connection to {host} dropped: {text.splitlines()[0][:160] or 'closed'}"
    if isinstance(exc, httpx.UnsupportedProtocol):
        return f"Not an http(s) address: {url}"
    return f"Talking to {host} failed: {text.splitlines()[0][:160] if text else type(exc).__name__}"


def http_problem(status: int, body: bytes, host: str, *, had_key: bool) -> str:
    """One line for an error status (the server's own message when it sends one)."""
    message = ""
    try:
        err = json.loads(body).get("error")
        message = err.get("message", "") if isinstance(err, dict) else str(err or "")
    except (ValueError, AttributeError):
        pass
    if status in (401, 403):
        what = "refused the API key" if had_key else "needs an API key"
        return f"{host} {what} ({status}): enter the key the server was started with."
    if status == 404:
        return f"{host} is not an OpenAI-compatible server (404 for /v1/models): check the address."
    message = message.splitlines()[0][:200] if message else ""
    return f"{host} answered {status}" + (f": {message}" if message else ".")


def probe(base_url: str, api_key: str = "", *, timeout: float = PROBE_TIMEOUT_S) -> Connection:
    """``GET /v1/models``: the connection with the server's models and kind, or a
    ``RemoteError`` saying in one line what is wrong (refused, timeout, 401, TLS, ...)."""
    base = normalize_url(base_url)
    host = urlsplit(base).netloc
    try:
        r = httpx.get(f"{base}/models", headers=auth_headers(api_key), timeout=timeout)
    except (httpx.HTTPError, ssl.SSLError, OSError) as exc:
        raise RemoteError(explain(exc, base, timeout=timeout)) from None
    if r.status_code != 200:
        raise RemoteError(http_problem(r.status_code, r.content, host, had_key=bool(api_key)))
    try:
        data = r.json().get("data")
        ids = tuple(str(m["id"]) for m in data)
    except (ValueError, AttributeError, TypeError, KeyError):
        raise RemoteError(f"{host} is not an OpenAI-compatible server: /v1/models did not "
                          "return a model list.") from None
    if not ids:
        raise RemoteError(f"{host} serves no models right now.")
    # MTP Chat's list says which model is loaded (``engine.server.openai_api.list_models``);
    # its replies confirm it with ``mtp`` stats.
    mtp = all(isinstance(m, dict) and "loaded" in m for m in data)
    if mtp:  # the loaded one first: the others would be loaded by name
        ids = tuple(sorted(ids, key=lambda i: not next(
            (m.get("loaded") for m in data if str(m["id"]) == i), False)))
    return Connection(base, api_key, ids, "mtp" if mtp else "openai")


class ConnectionStore:
    """The saved connections, one per base URL, in ``<config dir>/connections.json``."""

    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            from app.paths import config_dir

            path = config_dir(create=False) / FILE_NAME  # a read-only home still starts
        self.path = Path(path)

    def load(self) -> list[Connection]:
        try:
            rows = json.loads(self.path.read_text(encoding="utf-8"))
            return [Connection(r["base_url"], r.get("api_key", ""), tuple(r.get("models", ())),
                               r.get("kind", "openai")) for r in rows]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("cannot read the saved connections %s: %s", self.path, exc)
            return []

    def save(self, conns: list[Connection]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the keys are secrets
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump([asdict(c) for c in conns], f, indent=1)
        os.replace(tmp, self.path)

    def add(self, conn: Connection) -> None:
        """Save ``conn``, replacing a connection to the same base URL."""
        self.save([c for c in self.load() if c.base_url != conn.base_url] + [conn])

    def remove(self, base_url: str) -> None:
        self.save([c for c in self.load() if c.base_url != base_url])

    def find(self, base_url: str) -> Connection | None:
        return next((c for c in self.load() if c.base_url == base_url), None)
