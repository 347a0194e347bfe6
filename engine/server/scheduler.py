"""One model, one worker thread, a bounded FIFO of generation requests.

Contract:
- ``Scheduler(loader=...)`` (a no-argument callable returning a model; called on the worker
  thread, so the thread that loads the model is the one that runs it — MLX streams are
  thread-local) or ``Scheduler(model=...)`` (an already-built model handed over for good, e.g.
  a scripted fake). ``start()`` starts the worker; ``wait_ready()`` returns the model's
  ``ModelInfo`` or raises the loader's error.
- ``submit(GenRequest, sink)`` queues a request (a plain frozen dataclass) or raises
  ``QueueFull`` when ``max_queue`` requests already wait. ``sink(item)`` is called on the
  worker thread for each item of that request, in order: ``engine.types.Event`` objects
  (exactly what ``Model.generate`` yields, the last one carrying ``finish_reason``), then a
  final ``Done(summary)`` with the reply's ``engine.summary.ReplySummary``, or ``Failed(exc)``.
  Exactly one ``Done``/``Failed`` ends every accepted request, cancelled ones included.
- Cancellation: set ``request.cancel``; a queued request never starts, a running one ends
  within one cycle with ``finish_reason == "cancelled"``.
- The generator is always run to exhaustion (never closed early): the engine stores the
  decode state after the reply only then, and that is what lets the next request that
  extends this conversation skip re-prefilling it (the prompt cache).
- ``with_tokenizer(fn)`` runs ``fn(model)`` on the calling thread while no cycle runs (the
  worker holds the same lock around each step of the generator): prompt rendering and token
  counting happen off the worker without racing the tokenizer it uses to detokenize.
- ``drain(grace_s)`` stops accepting requests and cancels whatever still runs after
  ``grace_s``; ``stop()`` cancels everything and joins the worker.

Today the worker runs one request at a time; a batching worker would pop several
``GenRequest`` rows and call each sink the same way.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.summary import ReplySummary, ReplyTally
from engine.types import Depth, Event, ModelInfo, SamplingParams

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """``max_queue`` requests are already waiting."""


class SchedulerClosed(Exception):
    """The scheduler is draining or stopped and takes no new requests."""


@dataclass(frozen=True)
class GenRequest:
    """One generation: everything ``Model.generate`` needs, as plain data."""

    id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    depth: Depth = "auto"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)
    submitted_at: float = field(default_factory=time.perf_counter, compare=False)


@dataclass(frozen=True)
class Started:
    """The worker picked the request up (sent before its first event)."""

    waited_s: float


@dataclass(frozen=True)
class Done:
    summary: ReplySummary


@dataclass(frozen=True)
class Failed:
    error: BaseException


Item = Started | Event | Done | Failed
Sink = Callable[[Item], None]


class Scheduler:
    """See the module docstring."""

    def __init__(self, *, loader: Callable[[], object] | None = None, model=None,
                 max_queue: int = 16) -> None:
        if (loader is None) == (model is None):
            raise ValueError("pass exactly one of loader= or model=")
        self._loader = loader
        self.model = model
        self.info: ModelInfo | None = getattr(model, "info", None)
        self.max_queue = max_queue
        self._queue: queue.Queue[tuple[GenRequest, Sink] | None] = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()           # guards _waiting / _running / _closed
        self._tok_lock = threading.RLock()      # held around every generator step
        self._running: GenRequest | None = None
        self._closed = False
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="mtp-scheduler", daemon=True)
        self.completed = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> ModelInfo:
        if not self._ready.wait(timeout):
            raise TimeoutError("the model did not load in time")
        if self._load_error is not None:
            raise self._load_error
        assert self.info is not None
        return self.info

    def drain(self, grace_s: float = 10.0) -> None:
        """Refuse new requests; cancel the ones still running or queued after ``grace_s``."""
        with self._lock:
            self._closed = True
        if grace_s <= 0:
            self.cancel_all()
            return
        t = threading.Timer(grace_s, self.cancel_all)
        t.daemon = True
        t.start()

    def cancel_all(self) -> None:
        with self._lock:
            running = self._running
        if running is not None:
            running.cancel.set()
        for req, _ in list(self._queue.queue):  # type: ignore[misc]
            if req is not None:
                req.cancel.set()

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._closed = True
        self.cancel_all()
        self._queue.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ clients
    @property
    def busy(self) -> int:
        """Requests waiting or running."""
        with self._lock:
            return self._waiting + (self._running is not None)

    def submit(self, req: GenRequest, sink: Sink) -> None:
        with self._lock:
            if self._closed:
                raise SchedulerClosed("the server is shutting down")
            if self._waiting >= self.max_queue:
                raise QueueFull(f"{self._waiting} requests are already waiting")
            self._waiting += 1
        self._queue.put((req, sink))

    def with_tokenizer(self, fn: Callable[[object], object]):
        """``fn(model)`` while no generator step runs (see the module docstring)."""
        self._ready.wait()
        if self.model is None:
            raise SchedulerClosed("no model is loaded")
        with self._tok_lock:
            return fn(self.model)

    # ------------------------------------------------------------------ worker
    def _work(self) -> None:
        if self.model is None:
            try:
                self.model = self._loader()  # type: ignore[misc]
                self.info = self.model.info
            except BaseException as exc:  # noqa: BLE001 - reported by wait_ready
                self._load_error = exc
                self._ready.set()
                return
        self._ready.set()
        while True:
            job = self._queue.get()
            if job is None:
                return
            req, sink = job
            with self._lock:
                self._waiting -= 1
                self._running = req
            try:
                self._run(req, sink)
            finally:
                with self._lock:
                    self._running = None
                self.completed += 1

    def _run(self, req: GenRequest, sink: Sink) -> None:
        tally = ReplyTally()
        try:
            _safe(sink, Started(time.perf_counter() - req.submitted_at))
            if req.cancel.is_set():
                ev = Event(token_ids=(), finish_reason="cancelled")
                tally.add(ev)
                _safe(sink, ev)
            else:
                self._generate(req, sink, tally)
        except Exception as exc:  # noqa: BLE001 - one request failing must not stop the worker
            log.warning("request %s failed: %s", req.id, exc, exc_info=not _expected(exc))
            _safe(sink, Failed(exc))
            return
        _safe(sink, Done(tally.summary()))

    def _generate(self, req: GenRequest, sink: Sink, tally: ReplyTally) -> None:
        gen = self.model.generate(  # type: ignore[union-attr]
            list(req.prompt_ids), max_tokens=req.max_tokens, depth=req.depth,
            sampling=req.sampling, seed=req.seed, cancel=req.cancel,
            stop_strings=req.stop_strings)
        while True:
            with self._tok_lock:
                ev = next(gen, None)
            if ev is None:
                return
            tally.add(ev)
            _safe(sink, ev)


def _expected(exc: BaseException) -> bool:
    from engine.errors import EngineError

    return isinstance(exc, EngineError)


def _safe(sink: Sink, item: Item) -> None:
    try:
        sink(item)
    except Exception:  # noqa: BLE001 - a broken consumer must not stop the worker
        log.exception("request sink failed")
