"""The HTTP perimeter: what a request must look like before any route or API-key check sees it.

A localhost server is reachable from every web page the user opens (docs/SERVER.md): a page
can POST "simple" cross-origin requests (``text/plain``, form-encoded, multipart, or with no
type at all) without a preflight, and a DNS-rebinding page can make its own name resolve to
127.0.0.1 and read the replies. ``PerimeterMiddleware`` refuses, in this order:

1. a ``Host`` that is not a loopback name (``localhost``, ``*.localhost``, ``127.x.x.x``,
   ``[::1]``, with or without a port) when the server is bound to loopback: 403. This is what
   defeats DNS rebinding. With a non-loopback bind (which needs an API key) any Host passes.
2. an ``Origin`` that is neither the server's own (``http://`` + its ``Host``) nor in the
   allow-list: 403. CORS is off by default; ``allow_origins`` (``--allow-origin``) lists the
   browser front-ends allowed (exact origins, ``*`` patterns, or ``*`` for all). Their CORS
   preflights (``OPTIONS``) are answered here, before the API-key check, and their replies
   carry ``Access-Control-Allow-Origin``.
3. a body-carrying method (POST, PUT, PATCH, DELETE) whose ``Content-Type`` is not
   ``application/json`` (a ``charset`` parameter is fine): 415.
4. a body over ``max_body_bytes``: 413 at once when ``Content-Length`` says so (nothing is
   read), else while counting a chunked body, which stops at the limit; a client that stops
   sending mid-body for ``body_timeout_s`` gets 408.

Every refusal closes the connection (an unread body is not drained).

Refusals render in the API's error shape (Anthropic's for ``/v1/messages…``). Nothing here
knows models or routes; connection-level limits (header and idle timeouts, the connection
cap) are ``engine.server.connections``.
"""
from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import json
import logging
from collections import Counter
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

MiB = 1 << 20
DEFAULT_MAX_BODY_BYTES = 32 * MiB   # a 262k-token context as JSON, with room to spare
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ORIGINS_ENV = "MTPCHAT_ORIGINS"     # comma-separated, read by `engine serve` like OLLAMA_ORIGINS

# status -> (OpenAI error type, Anthropic error type)
_KINDS = {
    403: ("permission_error", "permission_error"),
    408: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "invalid_request_error"),
}


@dataclass(frozen=True)
class Perimeter:
    """What ``PerimeterMiddleware`` enforces (see the module docstring)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    allow_origins: tuple[str, ...] = ()
    loopback_hosts_only: bool = True
    body_timeout_s: float = 30.0


# ---------------------------------------------------------------------------------- names
def host_name(host: str) -> str:
    """The name part of a ``Host`` header (no port, no brackets), lower-case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else host


def is_loopback_name(name: str) -> bool:
    """``localhost``, ``*.localhost`` (reserved for loopback, RFC 6761), or a loopback IP."""
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normalize_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def parse_origins(items) -> tuple[str, ...]:
    """Allow-list entries from flags or ``MTPCHAT_ORIGINS`` (commas split one item)."""
    out: list[str] = []
    for item in items or ():
        out += [normalize_origin(o) for o in str(item).split(",") if o.strip()]
    return tuple(dict.fromkeys(out))


def origin_allowed(origin: str, allow: tuple[str, ...]) -> bool:
    origin = normalize_origin(origin)
    return any(origin == a or ("*" in a and fnmatch.fnmatchcase(origin, a)) for a in allow)


def is_json_type(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


# ----------------------------------------------------------------------------- responses
def _error_body(path: str, status: int, message: str, code: str | None) -> bytes:
    openai_kind, anthropic_kind = _KINDS[status]
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": anthropic_kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": openai_kind, "param": None, "code": code}}
    return json.dumps(body).encode()


async def refuse(scope: Scope, send: Send, status: int, message: str, *,
                 code: str | None = None) -> None:
    """Answer ``status`` and close the connection: the unread rest of a body is not drained."""
    body = _error_body(scope.get("path", ""), status, message, code)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------------------- middleware
class PerimeterMiddleware:
    """See the module docstring. Lets non-HTTP scopes through untouched."""

    def __init__(self, app: ASGIApp, perimeter: Perimeter,
                 refused: Counter[int] | None = None) -> None:
        self.app = app
        self.p = perimeter
        self.refused = refused if refused is not None else Counter()  # status -> count

    async def _refuse(self, scope: Scope, send: Send, status: int, message: str,
                      code: str) -> None:
        self.refused[status] += 1
        await refuse(scope, send, status, message, code=code)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        host, origin = headers.get("host"), headers.get("origin")
        if self.p.loopback_hosts_only and host is not None \
                and not is_loopback_name(host_name(host)):
            log.warning("refused a request for Host %r (not a loopback name)", host[:100])
            await self._refuse(scope, send, 403, f"Host {host[:100]!r} is not a loopback name: "
                               "this server answers only requests for localhost or 127.0.0.1.",
                               "host_not_allowed")
            return
        # the server's own pages (none today) are same-origin; they get no CORS headers
        cross = origin is not None and normalize_origin(origin) != f"http://{host or ''}".lower()
        if cross and not origin_allowed(origin, self.p.allow_origins):
            log.warning("refused a request from Origin %r (not allowed)", origin[:100])
            await self._refuse(scope, send, 403, f"Origin {origin[:100]!r} is not allowed. Web "
                               "pages may call this server only if it was started with "
                               "--allow-origin ORIGIN.", "origin_not_allowed")
            return
        if cross and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(send, origin, headers)
            return
        if cross:  # an allowed page may read the refusals below too
            send = _with_cors(send, origin)
        if not await self._body_ok(scope, headers, send):
            return
        if scope["method"] in BODY_METHODS:
            receive = await self._read_body(scope, receive, send)
            if receive is None:
                return
        await self.app(scope, receive, send)

    async def _preflight(self, send: Send, origin: str, headers: dict[str, str]) -> None:
        out = [(b"access-control-allow-origin", origin.encode()),
               (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
               (b"access-control-max-age", b"600"),
               (b"vary", b"Origin, Access-Control-Request-Headers"),
               (b"content-length", b"0")]
        if "access-control-request-headers" in headers:
            out.append((b"access-control-allow-headers",
                        headers["access-control-request-headers"].encode()))
        if "access-control-request-private-network" in headers:  # Chrome's private network
            # access: a public page asking for a local server
            out.append((b"access-control-allow-private-network", b"true"))
        await send({"type": "http.response.start", "status": 204, "headers": out})
        await send({"type": "http.response.body", "body": b""})

    async def _body_ok(self, scope: Scope, headers: dict[str, str], send: Send) -> bool:
        """Content-Type and Content-Length checks: nothing of the body is read yet."""
        if scope["method"] in BODY_METHODS and not is_json_type(headers.get("content-type", "")):
            given = headers.get("content-type")
            what = f"Content-Type {given[:100]!r}" if given else "a request without Content-Type"
            await self._refuse(scope, send, 415, f"Unsupported media type: {what}. Send the "
                               "request body as JSON, with 'Content-Type: application/json'.",
                               "unsupported_media_type")
            return False
        length = headers.get("content-length", "").strip()
        if length.isdigit() and int(length) > self.p.max_body_bytes:
            await self._too_large(scope, send)
            return False
        return True

    async def _too_large(self, scope: Scope, send: Send) -> None:
        limit = self.p.max_body_bytes
        await self._refuse(scope, send, 413, "The request body is larger than this server's "
                           f"limit of {limit / MiB:g} MiB ({limit} bytes; see --max-body-mb).",
                           "request_too_large")

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """Read the whole body, counting bytes; a ``receive`` that replays it, or None once
        the client was answered (413, 408) or left."""
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.p.body_timeout_s)
            except TimeoutError:
                await self._refuse(scope, send, 408, "The request body stopped arriving for "
                                   f"{self.p.body_timeout_s:g} s.", "request_timeout")
                return None
            if message["type"] != "http.request":
                return None  # http.disconnect: nobody to answer
            body = message.get("body", b"")
            total += len(body)
            if total > self.p.max_body_bytes:
                chunks.clear()
                await self._too_large(scope, send)
                return None
            if body:
                chunks.append(body)
            more = message.get("more_body", False)
        return _replay(chunks, receive)


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers, lower-case names, the first value of each, latin-1."""
    out: dict[str, str] = {}
    for name, value in scope.get("headers") or ():
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _replay(chunks: list[bytes], receive: Receive) -> Receive:
    """A ``receive`` that hands out ``chunks`` as the body, then defers to ``receive`` (for
    ``http.disconnect`` while a reply streams)."""
    pending = list(reversed(chunks)) or [b""]

    async def replay() -> Message:
        if pending:
            body = pending.pop()
            return {"type": "http.request", "body": body, "more_body": bool(pending)}
        return await receive()

    return replay


def _with_cors(send: Send, origin: str) -> Send:
    async def cors_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers") or [])
            headers += [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
            message = dict(message, headers=headers)
        await send(message)

    return cors_send
