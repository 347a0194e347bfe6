"""One model, one worker thread, a bounded FIFO of generation requests.

Contract:
- ``Scheduler(loader=...)`` (a no-argument callable returning a model; called on the worker
  thread, so the thread that loads the model is the one that runs it — MLX streams are
  thread-local) or ``Scheduler(model=...)`` (an already-built model handed over for good, e.g.
  a scripted fake). ``start()`` starts the worker; ``wait_ready()`` returns the model's
  ``ModelInfo`` or raises the loader's error.
- ``submit(GenRequest, sink)`` queues a request (a plain frozen dataclass) or raises
  ``QueueFull`` when ``max_queue`` requests of the same ``client`` already wait. ``sink(item)`` is called on the
  worker thread for each item of that request, in order: ``engine.types.Event`` objects
  (exactly what ``Model.generate`` yields, the last one carrying ``finish_reason``), then a
  final ``Done(summary)`` with the reply's ``engine.metrics.summary.ReplySummary``, or ``Failed(exc)``.
  Exactly one ``Done``/``Failed`` ends every accepted request, cancelled ones included.
- Cancellation: set ``request.cancel``; a queued request never starts, a running one ends
  within one cycle with ``finish_reason == "cancelled"``.
- The generator is always run to exhaustion (never closed early): the engine stores the
  decode state after the reply only then, and that is what lets the next request that
  extends this conversation skip re-prefilling it (the prompt cache).
- ``with_tokenizer(fn)`` runs ``fn(view)`` on the calling thread, ``view`` being the model's
  ``prompt_view()`` (``engine.models.model.PromptView``: its own tokenizer copy): prompt rendering
  and token counting happen off the worker and never stall a decode step, however long the
  prompt (a fake model without ``prompt_view`` runs while no cycle runs instead: the worker
  holds the same lock around each step of the generator).
- ``drain(grace_s)`` stops accepting requests and cancels whatever still runs after
  ``grace_s``; ``stop()`` cancels everything and joins the worker.

Hosting (the app): ``Scheduler.hosted(wake)`` starts no thread. The host thread (the app's
worker QThread, which loads the models) hands each model over with ``set_model(model)``
(``None`` while none is loaded) and calls ``run_next()`` whenever ``wake()`` was called (from
any thread, once per accepted request): it runs the request at the head of the queue on the
calling thread and returns. Chat replies and server requests then share one FIFO and one
thread. A request may carry ``render(model) -> prompt ids`` instead of ``prompt_ids``: it runs
on the worker just before the request starts (a chat reply is rendered with the model that
will run it). Swapping the model cancels the waiting requests that were rendered for the old
one (``prompt_ids`` given); requests with ``render`` wait for the new one.

``GenRequest.client`` names who asked ("server" by default, "chat" for the app's replies);
``count(client)`` is how many of that client's requests wait or run, ``cancel_all(client)``
and ``drain(grace_s, client=...)`` act on one client only (a server sharing the app's
scheduler drains its own requests and leaves the chat's alone). ``add_observer(fn)`` calls
``fn(request, item)`` on the worker thread after each item's sink (the app's dashboard
watches server requests this way).

Decoding: every request, alone or not, runs through the decoder the model makes
(``model.decoder(max_streams=...)``: the engine's ``BatchDecoder``, or a scripted fake's
stand-in with the same protocol: ``add``, ``admit_step``, ``cycle_step``, ``busy``, ``room``).
Up to ``max_streams`` requests decode together: they join between cycles after their prefill
and leave when they finish, each with its own sampling, seed, depth and cancel flag, and every
sink sees exactly what it would see alone (the same ``Event`` stream, then ``Done``).
``run_next`` runs until the decoder is empty (requests that arrive meanwhile join it). An idle
worker that takes a request first takes those arriving right behind it (``_gather``: each
within ``GATHER_S``), so a burst starts in one step and prefills in one forward.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.memory import MemoryGate, cut_note
from engine.core.threadexit import releasing
from engine.errors import EngineError
from engine.metrics.summary import ReplySummary, ReplyTally
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
    client: str = "server"
    # ``render(model) -> prompt ids``, called on the worker when the request starts (or None:
    # ``prompt_ids`` are final).
    render: Callable[[object], list[int]] | None = field(default=None, compare=False)
    # structured output: an OpenAI-style ``response_format`` (``engine.sampling.grammar``), or the
    # ``engine.sampling.grammar.Constraint`` already built from one for this request (the server
    # compiles off this thread: a large schema must not stall every stream), or None
    response_format: object | None = field(default=None, compare=False)


def prompt_of(ids):
    """A request's prompt as the decoder takes it: a list of ids, or an
    ``engine.vision.prompt.ImagePrompt`` kept whole (its images go with it)."""
    return ids if getattr(ids, "images", None) else list(ids)


@dataclass(frozen=True)
class Started:
    """The worker picked the request up (sent before its first event)."""

    waited_s: float


@dataclass(frozen=True)
class Done:
    summary: ReplySummary
    note: str = ""  # why the reply ended early, when the memory budget cut it


@dataclass(frozen=True)
class Failed:
    error: BaseException


Item = Started | Event | Done | Failed
Sink = Callable[[Item], None]
Observer = Callable[[GenRequest, Item], None]


class Scheduler:
    """See the module docstring."""

    def __init__(self, *, loader: Callable[[], object] | None = None, model=None,
                 max_queue: int = 16, wake: Callable[[], None] | None = None,
                 max_streams: int = 1, memory_budget: int | None = None) -> None:
        if wake is None and (loader is None) == (model is None):
            raise ValueError("pass exactly one of loader= or model=")
        self._loader = loader
        self.model = model
        self.info: ModelInfo | None = getattr(model, "info", None)
        self.max_queue = max_queue
        self.max_streams = max_streams
        self._wake = wake
        self._queue: queue.Queue[tuple[GenRequest, Sink] | None] = queue.Queue()
        self._waiting: list[GenRequest] = []
        self._lock = threading.Lock()           # guards _waiting / _running / _closed
        self._tok_lock = threading.RLock()      # held around every generator step
        self._running: list[GenRequest] = []
        self._closed = False
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._observers: list[Observer] = []
        self._sinks: dict[int, tuple[GenRequest, Sink]] = {}  # started, not finished
        self._thread = threading.Thread(target=releasing(self._work), name="mtp-scheduler",
                                        daemon=True)  # see engine/core/threadexit.py
        self.completed = 0
        self.warmup = None  # engine.core.warmup.WarmUp of the model now loaded (or None)
        self._warm_listeners: list[Callable[[int, int], None]] = []
        self.memory = MemoryGate(memory_budget)
        self._held: list[tuple[GenRequest, Sink]] = []  # taken, waiting for memory
        self._notes: dict[str, str] = {}

    @classmethod
    def hosted(cls, wake: Callable[[], None], *, max_queue: int = 16,
               max_streams: int = 1, memory_budget: int | None = None) -> Scheduler:
        """A scheduler without a thread of its own: see "Hosting" in the module docstring."""
        return cls(wake=wake, max_queue=max_queue, max_streams=max_streams,
                   memory_budget=memory_budget)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Scheduler:
        if self._wake is not None:
            raise RuntimeError("a hosted scheduler runs on its host's thread (run_next)")
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> ModelInfo:
        if not self._ready.wait(timeout):
            raise TimeoutError("the model did not load in time")
        if self._load_error is not None:
            raise self._load_error
        if self.info is None:
            raise SchedulerClosed("no model is loaded")
        return self.info

    def set_model(self, model) -> None:
        """Host thread: serve ``model`` from now on (None: no model). Waiting requests that
        were rendered for the previous model are cancelled."""
        _prepare_view(model)
        with self._tok_lock:
            self.model = model
            self.info = getattr(model, "info", None)
        self._start_warmup(model)
        with self._lock:
            stale = [r for r in self._waiting if r.render is None]
        for req in stale:
            req.cancel.set()
        self._ready.set()

    def drain(self, grace_s: float = 10.0, *, client: str | None = None) -> None:
        """Refuse new requests and cancel the ones still running or queued after
        ``grace_s``. With ``client``: only that client's are cancelled, and the scheduler
        keeps taking requests (its other clients go on)."""
        if client is None:
            with self._lock:
                self._closed = True
        if grace_s <= 0:
            self.cancel_all(client)
            return
        t = threading.Timer(grace_s, self.cancel_all, args=(client,))
        t.daemon = True
        t.start()

    def abort(self, error: BaseException) -> None:
        """Any thread, when the worker cannot go on (a cluster whose other machines stopped
        answering while the worker waits on them): refuse new requests and end every
        started and queued one with ``Failed(error)`` now."""
        with self._lock:
            self._closed = True
            started = list(self._sinks.values())
            self._sinks.clear()
        queued = []
        while (job := _poll(self._queue)) is not _EMPTY:
            if job is not None:
                queued.append(job)
        for req, sink in started + queued:
            req.cancel.set()
            _safe(sink, Failed(error))

    def cancel_all(self, client: str | None = None) -> None:
        with self._lock:
            reqs = list(self._waiting) + list(self._running)
        for req in reqs:
            if client is None or req.client == client:
                req.cancel.set()

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._closed = True
        self.cancel_all()
        if self.warmup is not None:
            self.warmup.cancel()
        if self._wake is not None:
            return  # hosted: the host runs what is left (each request ends cancelled)
        self._queue.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ clients
    @property
    def busy(self) -> int:
        """Requests waiting or running."""
        with self._lock:
            return len(self._waiting) + len(self._running)

    def count(self, client: str) -> int:
        """``client``'s requests waiting or running."""
        with self._lock:
            reqs = self._waiting + self._running
        return sum(r.client == client for r in reqs)

    def submit(self, req: GenRequest, sink: Sink) -> None:
        with self._lock:
            if self._closed:
                raise SchedulerClosed("the server is shutting down")
            waiting = sum(r.client == req.client for r in self._waiting)
            if waiting >= self.max_queue:
                raise QueueFull(f"{waiting} requests are already waiting")
            self._waiting.append(req)
            self._queue.put((req, sink))
        if self._wake is not None:
            self._wake()

    def add_observer(self, fn: Observer) -> None:
        self._observers.append(fn)

    def with_tokenizer(self, fn: Callable[[object], object]):
        """``fn(view)`` on the calling thread: ``view`` is the model's ``prompt_view()`` (its
        own tokenizer copy: decoding goes on meanwhile; a model without one, as the tests'
        scripted fakes, is passed itself while no generator step runs)."""
        self._ready.wait()
        model = self.model  # not waiting for the running step: its view was made first
        view = model.prompt_view() if hasattr(model, "prompt_view") else None
        if view is None:
            with self._tok_lock:
                if self.model is None:
                    raise SchedulerClosed("no model is loaded")
                return fn(self.model)
        with view.lock:
            return fn(view)

    # ------------------------------------------------------------------ worker
    def _work(self) -> None:
        if self.model is None:
            try:
                self.model = self._loader()  # type: ignore[misc]
                self.info = self.model.info
                _prepare_view(self.model)
            except BaseException as exc:  # noqa: BLE001 - reported by wait_ready
                self._load_error = exc
                self._ready.set()
                return
        self._start_warmup(self.model)
        self._ready.set()
        while self._run_job(self._next_job()):
            pass

    def _next_job(self) -> tuple[GenRequest, Sink] | None:
        """The next request (called as the last one ends); once none has run for
        ``WARM_IDLE_S``, the warm-up runs one step at a time while none waits."""
        idle_since = time.monotonic()
        while self.warmup is not None and not self.warmup.finished:
            wait = idle_since + WARM_IDLE_S - time.monotonic()
            if wait <= 0:
                self.warm_step()  # nothing when a request came meanwhile: it is taken next
            if (job := _poll(self._queue, wait)) is not _EMPTY:
                return job
        return self._queue.get()

    # ------------------------------------------------------------------ warm-up
    def status(self) -> dict:
        """What ``/health`` adds: the warm-up's progress (``warmup``: done, total, finished)."""
        out = {"memory": self.memory.status()} if self.memory.footprint is not None else {}
        warm = self.warmup
        if warm is not None:
            out["warmup"] = {"done": warm.done, "total": warm.total, "finished": warm.finished}
        return out

    def add_warmup_listener(self, fn: Callable[[int, int], None]) -> None:
        """``fn(done, total)`` on the worker thread as the warm-up progresses."""
        self._warm_listeners.append(fn)

    def warm_step(self) -> bool:
        """Worker/host thread, only while no request waits: one step of the model's warm-up
        (``engine.core.warmup``); whether more remain."""
        warm = self.warmup
        if warm is None or warm.finished or not self._queue.empty():
            return False
        with self._tok_lock:
            return warm.step()

    def _start_warmup(self, model) -> None:
        from engine.core import warmup

        if self.warmup is not None:
            self.warmup.cancel()
        self.memory.attach(model)

        def progress(done: int, total: int) -> None:
            for fn in list(self._warm_listeners):
                fn(done, total)
        self.warmup = warmup.for_model(model, max_streams=self.max_streams,
                                       on_progress=progress)

    def run_next(self) -> bool:
        """Host thread: run the request at the head of the queue (if any) to its end.
        Returns whether one ran."""
        job = _poll(self._queue)
        return job is not _EMPTY and self._run_job(job)

    def _run_job(self, job: tuple[GenRequest, Sink] | None) -> bool:
        if job is None:
            return False
        return self._run_batch(job)

    def _begin(self, req: GenRequest) -> None:
        with self._lock:
            self._waiting = [r for r in self._waiting if r is not req]
            self._running.append(req)

    def _end(self, req: GenRequest) -> None:
        with self._lock:
            self._running = [r for r in self._running if r is not req]
        self.completed += 1

    # ------------------------------------------------------------------ batched worker
    def _run_batch(self, job: tuple[GenRequest, Sink]) -> bool:
        """Decode ``job`` and every request that arrives meanwhile together, until none is
        left (see "Decoding" in the module docstring). False when ``stop`` was called."""
        dec = self._decoder()
        live: dict[str, tuple[GenRequest, Sink, ReplyTally]] = {}
        self._held.append(job)
        go_on = _gather(self._queue, self._held)
        self.memory.remeasure()  # nothing runs yet
        while True:
            self._admit_held(dec, live)
            while go_on and not self._held and (dec is None or dec.room > 0):
                nxt = _poll(self._queue)
                if nxt is _EMPTY:
                    break
                if nxt is None:
                    go_on = False
                else:
                    self._held.append(nxt)
                    self._admit_held(dec, live)
            if dec is None or not dec.busy:
                if self._held and dec is not None:  # nothing runs and it still waits
                    self._admit_held(dec, live, force=True)
                    continue
                return go_on
            if not self._batch_step(dec, live):
                dec = self._decoder()

    def _admit_held(self, dec, live: dict, force: bool = False) -> None:
        """Admit the requests taken from the queue, in order, while the memory budget holds
        them (``engine.core.memory``); the first that must wait keeps the rest waiting.
        ``force``: nothing runs, so what is kept of finished replies is dropped first."""
        while self._held and (dec is None or dec.room > 0):
            if force and dec is not None:
                self.memory.free_kept(dec.carryover)
            if not self._admit(dec, live, self._held[0], alone=force):
                return
            self._held.pop(0)
            force = False

    def _admit(self, dec, live: dict, job: tuple[GenRequest, Sink], alone: bool = False) -> bool:
        """Start ``job`` (or end it: cancelled, failed); False when it must wait for memory
        (``alone``: nothing else runs, so it cannot wait: it fails)."""
        req, sink = job
        budget = self._budget_for(dec, req, alone)
        if budget is None:
            return False
        self._begin(req)
        sink, tally = self._observed(req, sink), ReplyTally()
        with self._lock:
            self._sinks[id(req)] = (req, sink)
        _safe(sink, Started(time.perf_counter() - req.submitted_at))
        try:
            if req.cancel.is_set():
                ev = Event(token_ids=(), finish_reason="cancelled")
                tally.add(ev)
                _safe(sink, ev)
                self._finish(req, sink, Done(tally.summary()))
                return True
            if isinstance(budget, BaseException):
                raise budget
            ids, max_tokens = budget
            with self._tok_lock:
                model = self.model
                st = dec.add(ids, max_tokens=max_tokens, depth=req.depth,
                             sampling=req.sampling, seed=req.seed, cancel=req.cancel,
                             stop_strings=req.stop_strings,
                             **_constraint_kw(model, req.response_format))
        except Exception as exc:  # noqa: BLE001 - one request failing must not stop the others
            log.warning("request %s failed: %s", req.id, exc, exc_info=not _expected(exc))
            self.memory.release(req.id)
            self._finish(req, sink, Failed(exc))
            return True
        if max_tokens < req.max_tokens:
            self._notes[st.id] = cut_note(max_tokens, self.memory.budget)
        live[st.id] = (req, sink, tally)
        return True

    def _budget_for(self, dec, req: GenRequest, alone: bool = False):
        """(prompt ids, max_tokens within the memory budget); None: wait for memory; an
        exception: the request fails with it (no model; its prompt alone exceeds the budget)."""
        if req.cancel.is_set():
            return ([], req.max_tokens)
        try:
            with self._tok_lock:
                model = self.model
                if model is None or dec is None:
                    raise EngineError("No model is loaded yet.")
                ids = prompt_of(req.prompt_ids if req.render is None else req.render(model))
            kind, max_tokens = self.memory.verdict(req.id, len(ids), req.max_tokens, req.depth)
        except Exception as exc:  # noqa: BLE001 - delivered as the request's Failed
            return exc
        if kind == "wait" and alone:
            return self.memory.refusal()
        return None if kind == "wait" else (ids, max_tokens)

    def _batch_step(self, dec, live: dict) -> bool:
        """One ``dec.step()``, its events to their sinks; False when it failed (every request
        in it has then ended with ``Failed``)."""
        parts = getattr(dec, "parts", None)  # a cluster's decoder admits one per step
        for part in parts() if parts else (dec.admit_step, dec.cycle_step):  # 1st tokens 1st
            try:
                with self._tok_lock:
                    events = part()
            except Exception as exc:  # noqa: BLE001 - the batch's state is unknown: end it all
                log.exception("a batched cycle failed")
                for req, sink, _ in live.values():
                    req.cancel.set()
                    self._finish(req, sink, Failed(exc))
                live.clear()
                return False
            self._deliver(events, live)
        for sid in self.memory.cut_growth(dec.active, live, self._notes):
            self._notes[sid] = cut_note(len(_stream_of(dec, sid).reply.generated) + 1,
                                         self.memory.budget)
        return True

    def _deliver(self, events, live: dict) -> None:
        for st, ev in events:
            req, sink, tally = live[st.id]
            tally.add(ev)
            _safe(sink, ev)
            if ev.finish_reason is not None:
                del live[st.id]
                if self.memory.footprint is not None:
                    self.memory.release(req.id, len(st.prompt) + len(st.reply.generated))
                note = self._notes.pop(st.id, "") if ev.finish_reason == "length" else ""
                self._notes.pop(st.id, None)
                if note:
                    log.warning("request %s: %s", req.id, note)
                self._finish(req, sink, Done(tally.summary(), note))

    def _finish(self, req: GenRequest, sink: Sink, item: Item) -> None:
        with self._lock:
            live = self._sinks.pop(id(req), None) is not None
        if live:  # not already ended by ``abort``
            _safe(sink, item)
        self._end(req)

    def _observed(self, req: GenRequest, sink: Sink) -> Sink:
        if not self._observers:
            return sink
        observers = list(self._observers)

        def both(item: Item) -> None:
            sink(item)
            for fn in observers:
                _safe(lambda it: fn(req, it), item)
        return both

    def _decoder(self):
        """A decoder for the model now loaded (None while none is)."""
        model = self.model
        return None if model is None else model.decoder(max_streams=self.max_streams)


_EMPTY = object()  # what ``_poll`` gives when nothing waits (None is the stop sentinel)
# A scheduler thread of its own (a server) runs its warm-up only once no request has run for
# this long: a burst that arrives as the server starts listening, or a client's next request a
# few ms after its last reply, finds the thread free instead of inside a warm-up step (a
# fresh server's first 4-stream burst: 0.70 of a warm burst with the warm-up stepping from
# the start, 0.95 with it off, on the CI machine kind).
WARM_IDLE_S = 0.3
GATHER_S = 0.002      # a request this soon after the one before joins a new batch's first step
GATHER_MAX_S = 0.02   # ... for at most this long


def _gather(q: queue.Queue, held: list) -> bool:
    """Before a batch's first step: move to ``held`` the requests that arrive right behind the
    first (each within ``GATHER_S`` of the one before, at most ``GATHER_MAX_S`` in all), so a
    burst of clients' requests, which reach the queue a few milliseconds apart, prefill
    together (``engine.decoding.together``) instead of the first alone. A lone request waits
    ``GATHER_S``. False when ``stop`` came meanwhile."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < GATHER_MAX_S:
        nxt = _poll(q, GATHER_S)
        if nxt is _EMPTY:
            break
        if nxt is None:
            return False
        held.append(nxt)
    log.debug("gathered %d in %.1f ms", len(held), (time.perf_counter() - t0) * 1e3)
    return True


def _poll(q: queue.Queue, wait: float = 0.0):
    """The queue's next item, waiting up to ``wait`` seconds (none when <= 0), or ``_EMPTY``."""
    try:
        return q.get(timeout=wait) if wait > 0 else q.get_nowait()
    except queue.Empty:
        return _EMPTY


def _stream_of(dec, sid: str):
    return next(st for st in dec.active if st.id == sid)


def _prepare_view(model) -> None:
    """Make the model's ``PromptView`` now, on the thread that loaded it, so the first
    request does not copy the tokenizer while holding the decode lock."""
    if model is not None and hasattr(model, "prompt_view"):
        model.prompt_view()


def _constraint_kw(model, response_format) -> dict:
    """``constraint=`` for ``Model.generate`` when the request asks for structured output."""
    if not response_format:
        return {}
    from engine.sampling.grammar import Constraint

    if isinstance(response_format, Constraint):
        return {"constraint": response_format}
    return {"constraint": Constraint.for_format(
        model.tokenizer, response_format, vocab_size=model.info.vocab_size,
        eos_ids=model.info.eos_token_ids)}


def _expected(exc: BaseException) -> bool:
    return isinstance(exc, EngineError)


def _safe(sink: Sink, item: Item) -> None:
    try:
        sink(item)
    except Exception:  # noqa: BLE001 - a broken consumer must not stop the worker
        log.exception("request sink failed")
