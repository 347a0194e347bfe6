"""Run the server: ``Server`` (uvicorn around ``build_app``) and ``start_server``.

Contract:
- ``Server(scheduler, host=..., port=..., api_key=..., default_depth=..., drain_s=...)``.
  ``serve()`` blocks (on the main thread it handles SIGINT/SIGTERM: stop accepting, let
  in-flight replies run up to ``drain_s`` seconds, then cancel them so every stream ends with
  its final event; it returns normally, so the caller exits 0). ``start()`` runs it on a
  background thread and returns once it listens (the app will use this); ``stop()`` drains
  and joins. ``url`` is the address it listens on (``port=0`` picks a free port).
- ``is_loopback(host)``; binding anything else without an API key raises ``ValueError``.
- The scheduler is not owned: ``stop()`` drains it but leaves it running unless
  ``stop_scheduler=True`` (the app shares its scheduler with the chat).
"""
from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import threading

import uvicorn

from engine.server.app import build_app
from engine.server.common import Backend
from engine.server.scheduler import Scheduler
from engine.types import Depth

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
                 drain_s: float = 10.0, log_level: str = "warning") -> None:
        if not is_loopback(host) and not api_key:
            raise ValueError(f"Refusing to serve on {host} without an API key: anyone who can "
                             "reach this address could use the model. Pass --api-key KEY or "
                             "bind 127.0.0.1.")
        self.scheduler = scheduler
        self.drain_s = drain_s
        info = scheduler.wait_ready()
        self.backend = Backend(scheduler=scheduler, info=info, default_depth=default_depth,
                               api_key=api_key)
        self.app = build_app(self.backend)
        config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level,
                                lifespan="off", timeout_graceful_shutdown=drain_s + 5,
                                timeout_keep_alive=5)
        self._uv = _Uvicorn(config, self._drain)
        self._thread: threading.Thread | None = None
        self._draining = False

    def _drain(self) -> None:
        if not self._draining:
            self._draining = True
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

    def serve(self) -> None:
        try:
            self._uv.run()
        finally:
            self.backend.executor.shutdown(wait=True, cancel_futures=True)

    def start(self, timeout: float = 30.0) -> Server:
        self._thread = threading.Thread(target=self.serve, name="mtp-server", daemon=True)
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout / 0.02)):
            if self._uv.started or not self._thread.is_alive():
                break
            deadline.wait(0.02)
        if not self._uv.started:
            raise RuntimeError("the server did not start (is the port in use?)")
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
                 max_queue: int = 16, **kwargs) -> Server:
    """Serve a ``Scheduler`` (shared, e.g. the app's) or a model handed over for good
    (wrapped in a new scheduler) on a background thread; returns the started ``Server``."""
    scheduler = model_or_scheduler
    if not isinstance(scheduler, Scheduler):
        scheduler = Scheduler(model=model_or_scheduler, max_queue=max_queue).start()
    return Server(scheduler, host=host, port=port, **kwargs).start()
