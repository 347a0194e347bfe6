"""Connection-level limits under the ASGI app: silent sockets, too many sockets, log floods.

uvicorn's h11 protocol arms its keep-alive timer only after a response, so a connection that
never sends a request lives forever; its ``limit_concurrency`` answers 503 only once a request
arrives and never closes an idle socket. A couple of thousand silent connections therefore
used up the file descriptors, and asyncio then logged "socket.accept() out of system
resource" (with a traceback) on every retry. Here:

- ``make_protocol(header_timeout_s=..., max_connections=...)``: an ``H11Protocol`` that closes
  a connection whose request headers are not complete ``header_timeout_s`` after it opened
  (or after the first byte of a later request; between requests uvicorn's keep-alive timeout
  applies). Past ``max_connections`` open connections, a new one evicts the oldest connection
  that has no request in progress; if every one is busy, the new one gets a 503 and is closed
  at once, so refused sockets never pile up.
- ``connection_cap(wanted)``: ``wanted`` lowered to what the file-descriptor limit leaves.
- ``raise_fd_limit()``: the soft RLIMIT_NOFILE raised towards the hard one.
- ``RateLimitFilter``: lets one record of each kind through per period, with the count of
  those it swallowed, installed on the loggers that flood (``install_log_limits()``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 512
HEADER_TIMEOUT_S = 10.0
ACCEPT_BURST = 512      # the listen backlog: asyncio may accept this many before any runs
FD_RESERVE = 64         # descriptors kept for the model's files, logs, pipes
FLOODING_LOGGERS = ("asyncio", "uvicorn.error", "engine.server.guard")

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
         b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
_BUSY_BODY = (b'{"error": {"message": "Too many open connections; try again.", '
              b'"type": "server_error", "param": null, "code": "too_many_connections"}}')


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a connection cap (see the module
    docstring); ``make_protocol`` makes the subclass one server uses."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    idle: ClassVar[dict[H11Protocol, None]] = {}  # no request in progress, oldest first
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._evict_one():
            transport.write(_BUSY % (len(_BUSY_BODY), _BUSY_BODY))
            transport.close()
            return
        self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self.idle.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:   # request headers not complete yet
            self._await_request()
        else:
            self._cancel_header_timer()
            self.idle.pop(self, None)

    def on_response_complete(self) -> None:
        super().on_response_complete()   # arms uvicorn's keep-alive timer
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.idle[self] = None

    def _await_request(self) -> None:
        self.idle.setdefault(self, None)
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s,
                                                      self._on_header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.idle.pop(self, None)
            self.transport.close()

    def _evict_one(self) -> bool:
        for other in self.idle:
            if other is not self:
                del self.idle[other]
                other._cancel_header_timer()
                other.transport.close()
                return True
        return False


def make_protocol(*, header_timeout_s: float = HEADER_TIMEOUT_S,
                  max_connections: int = DEFAULT_MAX_CONNECTIONS) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)``, one per server: it holds that
    server's idle connections, to evict."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"header_timeout_s": header_timeout_s, "max_connections": max_connections,
                 "idle": {}})


def open_fds() -> int | None:
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(where))
        except OSError:
            continue
    return None


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (macOS: at most 10240, its per-process
    cap when the hard limit is unlimited); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, 10240):
        if target == resource.RLIM_INFINITY or target <= soft:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            continue
    return soft


def connection_cap(wanted: int, fd_limit: int | None = None) -> int:
    """``wanted``, lowered so that accepting a full burst past the cap stays under the
    file-descriptor limit (then no accept() fails with EMFILE)."""
    if fd_limit is None:
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if fd_limit == resource.RLIM_INFINITY:
        return wanted
    used = open_fds() or 64
    return max(8, min(wanted, fd_limit - used - ACCEPT_BURST - FD_RESERVE))


class RateLimitFilter(logging.Filter):
    """Lets the first record of each (logger, message template) through, then at most one per
    ``period_s``, which says how many were swallowed since."""

    def __init__(self, period_s: float = 10.0) -> None:
        super().__init__()
        self.period_s = period_s
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg).split("\n", 1)[0][:200])
        now = time.monotonic()
        last, swallowed = self._seen.get(key, (-1e18, 0))
        if now - last < self.period_s:
            self._seen[key] = (last, swallowed + 1)
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if swallowed:  # no "%" added: the text is safe whether or not it has args
            record.msg = f"{record.msg} [{swallowed} more like this in the last " \
                         f"{now - last:.0f} s not logged]"
        return True


def install_log_limits(period_s: float = 10.0) -> None:
    """Put one ``RateLimitFilter`` on each logger that floods under attack (idempotent)."""
    for name in FLOODING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
            logger.addFilter(RateLimitFilter(period_s))
