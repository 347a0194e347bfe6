"""Run the server: ``Server`` (uvicorn around ``build_app``) and ``start_server``.

Contract:
- ``Server(scheduler, host=..., port=..., api_key=..., default_depth=..., drain_s=...)``.
  ``serve()`` blocks (on the main thread it handles SIGINT/SIGTERM: stop accepting, let
  in-flight replies run up to ``drain_s`` seconds, then cancel them so every stream ends with
  its final event; it returns normally, so the caller exits 0). ``start()`` runs it on a
  background thread and returns once it listens (the app uses this); ``stop()`` drains
  and joins. ``url`` is the address it listens on (``port=0`` picks a free port).
  ``start()`` binds the socket itself, so an address in use raises ``ServerStartError``
  with a message naming the port, before any thread is left behind.
- ``is_loopback(host)``; binding anything else without an API key raises ``ValueError``.
- Hostile clients: ``perimeter`` (``engine.server.guard.Perimeter``: body size, allowed
  origins; the Host check is on exactly when ``host`` is loopback) is enforced before the
  API key; ``max_connections`` (lowered to what the file-descriptor limit leaves, after
  raising the soft limit to the hard one) and a ``header_timeout_s`` for silent sockets are
  enforced under uvicorn (``engine.server.connections``); floods of identical log records
  are rate-limited.
- The scheduler is not owned: ``stop()`` leaves it running unless ``stop_scheduler=True``.
  With ``shared=True`` (the app, whose chat uses the same scheduler) draining refuses new
  HTTP requests and cancels only the server's own requests (``client="server"``); otherwise
  it closes the scheduler to everyone (``engine serve``).
"""
from __future__ import annotations

import contextlib
import errno
import importlib
import ipaddress
import logging
import signal
import socket
import threading
from dataclasses import replace

import uvicorn

from engine.core.scheduler import Scheduler
from engine.server import connections
from engine.server.app import build_app
from engine.server.common import Backend
from engine.server.guard import Perimeter
from engine.types import Depth

# Modules a fresh server's first request would otherwise import in its own time, so they are
# imported before it listens: anyio's asyncio backend (imported by the first streamed reply:
# 76 ms of a first 4-stream burst on the CI machine kind) and the decoding package (imported
# when the first batch starts, some twenty modules).
PRELOAD = ("anyio._backends._asyncio", "anyio.streams.memory", "anyio.streams.stapled",
           "engine.decoding.decoder", "engine.decoding.diskcache", "engine.core.carryover",
           "engine.depth.controller", "engine.models.chat_template", "platformdirs")


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerStartError(Exception):
    """The server could not listen (the port is in use, the address is not this machine's)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port), or ``ServerStartError`` saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(connections.ACCEPT_BURST)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServerStartError(f"Port {port} on {host} is already in use by another "
                                   "program. Choose another port, or stop that program.") from None
        raise ServerStartError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    sock.set_inheritable(True)
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn that drains the scheduler on the first signal and does not re-raise it."""

    def __init__(self, config: uvicorn.Config, on_exit) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        saved = {s: signal.signal(s, self.handle_exit) for s in sigs}
        try:
            yield
        finally:
            for s, h in saved.items():
                signal.signal(s, h)


class Server:
    """See the module docstring."""

    def __init__(self, scheduler: Scheduler, *, host: str = "127.0.0.1", port: int = 8080,
                 api_key: str | None = None, default_depth: Depth = "auto",
                 drain_s: float = 10.0, log_level: str = "warning",
                 shared: bool = False, perimeter: Perimeter | None = None,
                 max_connections: int = connections.DEFAULT_MAX_CONNECTIONS,
                 header_timeout_s: float = connections.HEADER_TIMEOUT_S,
                 images=None) -> None:
        if not is_loopback(host) and not api_key:
            raise ValueError(f"Refusing to serve on {host} without an API key: anyone who can "
                             "reach this address could use the model. Pass --api-key KEY or "
                             "bind 127.0.0.1.")
        self.scheduler = scheduler
        self.drain_s = drain_s
        self.shared = shared
        preload()
        info = scheduler.wait_ready()
        self.backend = Backend(scheduler=scheduler, info=info, default_depth=default_depth,
                               api_key=api_key)
        if images is not None:  # engine.server.images.ImagePolicy
            self.backend.images = images
        self.perimeter = replace(perimeter or Perimeter(), loopback_hosts_only=is_loopback(host))
        self.app = build_app(self.backend, self.perimeter)
        self.max_connections = connections.connection_cap(max_connections,
                                                          connections.raise_fd_limit())
        protocol = connections.make_protocol(header_timeout_s=header_timeout_s,
                                             max_connections=self.max_connections)
        config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level,
                                lifespan="off", timeout_graceful_shutdown=drain_s + 5,
                                timeout_keep_alive=5, http=protocol,
                                backlog=connections.ACCEPT_BURST)
        connections.install_log_limits()  # after Config, which configures uvicorn's loggers
        self._uv = _Uvicorn(config, self._drain)
        self._thread: threading.Thread | None = None
        self._draining = False

    def _drain(self) -> None:
        if not self._draining:
            self._draining = True
            self.backend.accepting = False
            if self.shared:
                log.info("draining: %d server request(s) in flight",
                         self.scheduler.count("server"))
                self.scheduler.drain(self.drain_s, client="server")
            else:
                log.info("draining: %d request(s) in flight", self.scheduler.busy)
                self.scheduler.drain(self.drain_s)

    @property
    def url(self) -> str:
        host, port = self._uv.config.host, self._uv.config.port
        for srv in self._uv.servers:
            for sock in srv.sockets:
                host, port = sock.getsockname()[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"

    @property
    def started(self) -> bool:
        return self._uv.started

    def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            self._uv.run(sockets=sockets)
        finally:
            self.backend.executor.shutdown(wait=True, cancel_futures=True)
            for sock in sockets or ():
                sock.close()

    def start(self, timeout: float = 30.0) -> Server:
        sock = bind(self._uv.config.host, self._uv.config.port)
        self._thread = threading.Thread(target=self.serve, args=([sock],), name="mtp-server",
                                        daemon=True)
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout / 0.02)):
            if self._uv.started or not self._thread.is_alive():
                break
            deadline.wait(0.02)
        if not self._uv.started:
            self.stop()
            raise ServerStartError("The server did not start in time.")
        return self

    def stop(self, *, drain_s: float = 0.0, stop_scheduler: bool = False) -> None:
        self.drain_s = drain_s
        self._drain()
        self._uv.should_exit = True
        if self._thread is not None:
            self._thread.join(drain_s + 15)
        if stop_scheduler:
            self.scheduler.stop()


def start_server(model_or_scheduler, *, host: str = "127.0.0.1", port: int = 8080,
                 max_queue: int = 16, max_streams: int | None = None, **kwargs) -> Server:
    """Serve a ``Scheduler`` (shared, e.g. the app's: its other clients go on while the
    server drains) or a model handed over for good (wrapped in a new scheduler) on a
    background thread; returns the started ``Server``. ``max_streams``: requests decoded
    together (``engine.decoding.decoder``; default ``DEFAULT_STREAMS``, 1 = one at a time)."""
    scheduler = model_or_scheduler
    shared = isinstance(scheduler, Scheduler)
    if not shared:
        if max_streams is None:
            from engine.decoding.decoder import DEFAULT_STREAMS as max_streams
        scheduler = Scheduler(model=model_or_scheduler, max_queue=max_queue,
                              max_streams=max_streams).start()
    kwargs.setdefault("shared", shared)
    return Server(scheduler, host=host, port=port, **kwargs).start()
