"""``ScriptedDecoder``: the decoder protocol of ``engine.decoding.decoder.BatchDecoder`` (what the
engine's scheduler drives, one stream or many) over scripted event streams, for fakes of
``engine.Model`` (``app.fake.engine.FakeModel``; reusable by any other scripted model).

::

    dec = ScriptedDecoder(start, max_streams=N, pace=None)
    dec.busy                 # any stream waiting or decoding
    dec.room                 # how many more add() calls it takes now
    st = dec.add(prompt_ids, *, max_tokens=256, depth="auto", sampling=None, seed=None,
                 cancel=None, stop_strings=(), constraint=None, id=None)   # st.id: str
    dec.admit_step()         # [(stream, Event)]: cancelled streams end; one waiting joins
    dec.cycle_step()         # [(stream, Event)]: one Event for every joined stream
    dec.close()              # [(stream, Event)]: every stream ends now, cancelled

``start(request: StreamRequest) -> Iterator[Event]`` is called by ``add`` with the request's
arguments (it may raise, e.g. ``engine.errors.GenerationError``, to refuse it). The iterator's
first event is the stream's prefill event (returned by the ``admit_step`` that joins the stream;
at most one joins per ``admit_step``, while fewer than ``max_streams`` are joined); every later
one is a cycle: ``cycle_step`` advances each joined stream by one event, round-robin. A stream
ends with its first event whose ``finish_reason`` is not None (an iterator that runs out ends it
with "stop"); a stream whose ``cancel`` is set ends, instead of advancing, with
``Event(token_ids=(), finish_reason="cancelled")``. An exception from an iterator leaves
``cycle_step`` or ``admit_step`` (as a failed batched cycle does: the caller ends every stream).

A cycle's ``CycleStats`` say how many streams it decoded (``batch_rows``), as the real ones do.
``pace(events)``, when given, is called once per ``cycle_step`` with that cycle's events before
they are returned: a fake sleeps there for the cycle's duration. A batched cycle of R streams
takes about one cycle's time in the real engine, not R times, so pace once per cycle.

Not thread-safe, like ``BatchDecoder``: one thread calls ``add`` and the steps.
"""
from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.errors import GenerationError
from engine.types import Event, SamplingParams

_ids = itertools.count(1)


@dataclass(frozen=True)
class StreamRequest:
    """What ``add`` was asked for: the arguments of ``BatchDecoder.add``."""

    prompt_ids: tuple[int, ...]
    max_tokens: int = 256
    depth: int | str = "auto"
    sampling: SamplingParams | None = None
    seed: int | None = None
    cancel: threading.Event | None = None
    stop_strings: tuple[str, ...] = ()
    constraint: Any = None
    id: str = ""


@dataclass(eq=False)
class ScriptedStream:
    """One stream of a ``ScriptedDecoder``: its request and the rest of its events."""

    id: str
    request: StreamRequest
    events: Iterator[Event] = field(repr=False)
    finished: bool = False

    @property
    def cancelled(self) -> bool:
        cancel = self.request.cancel
        return cancel is not None and cancel.is_set()


class ScriptedDecoder:
    """See the module docstring."""

    def __init__(self, start: Callable[[StreamRequest], Iterator[Event]], *,
                 max_streams: int = 8,
                 pace: Callable[[list[tuple[ScriptedStream, Event]]], None] | None = None
                 ) -> None:
        if max_streams < 1:
            raise GenerationError(f"max_streams must be at least 1, not {max_streams}")
        self.max_streams = max_streams
        self._start = start
        self._pace = pace
        self.waiting: deque[ScriptedStream] = deque()
        self.active: list[ScriptedStream] = []  # joined, in the order they joined
        self.cycles = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.active)

    @property
    def room(self) -> int:
        return max(0, self.max_streams - len(self.waiting) - len(self.active))

    def add(self, prompt_ids, *, max_tokens: int = 256, depth: int | str = "auto",
            sampling: SamplingParams | None = None, seed: int | None = None,
            cancel: threading.Event | None = None, stop_strings=(), constraint=None,
            id: str | None = None) -> ScriptedStream:
        req = StreamRequest(tuple(prompt_ids), max_tokens, depth, sampling, seed, cancel,
                            tuple(stop_strings), constraint, id or f"scripted-{next(_ids)}")
        st = ScriptedStream(req.id, req, iter(self._start(req)))
        self.waiting.append(st)
        return st

    def step(self) -> list[tuple[ScriptedStream, Event]]:
        """``admit_step()`` then ``cycle_step()``; their events, in order."""
        return self.admit_step() + self.cycle_step()

    def admit_step(self) -> list[tuple[ScriptedStream, Event]]:
        out = [self._cancel(st) for st in [*self.waiting, *self.active] if st.cancelled]
        self.waiting = deque(st for st in self.waiting if not st.finished)
        self.active = [st for st in self.active if not st.finished]
        if self.waiting and len(self.active) < self.max_streams:
            st = self.waiting.popleft()
            ev = self._next(st)
            if not st.finished:
                self.active.append(st)
            out.append((st, ev))
        return out

    def cycle_step(self) -> list[tuple[ScriptedStream, Event]]:
        if not self.active:
            return []
        rows = len(self.active)
        out = [self._cancel(st) if st.cancelled else (st, _rows(self._next(st), rows))
               for st in self.active]
        self.active = [st for st in self.active if not st.finished]
        self.cycles += 1
        if self._pace is not None:
            self._pace(out)
        return out

    def close(self) -> list[tuple[ScriptedStream, Event]]:
        """End every stream now (cancelled)."""
        out = [self._cancel(st) for st in [*self.waiting, *self.active]]
        self.waiting.clear()
        self.active.clear()
        return out

    def _next(self, st: ScriptedStream) -> Event:
        ev = next(st.events, None)
        if ev is None:
            ev = Event(token_ids=(), finish_reason="stop")
        st.finished = ev.finish_reason is not None
        return ev

    @staticmethod
    def _cancel(st: ScriptedStream) -> tuple[ScriptedStream, Event]:
        st.finished = True
        return st, Event(token_ids=(), finish_reason="cancelled")


def _rows(ev: Event, rows: int) -> Event:
    """``ev`` with its cycle's ``batch_rows`` (the streams decoded in it)."""
    if ev.stats is None or ev.stats.batch_rows == rows:
        return ev
    return replace(ev, stats=replace(ev.stats, batch_rows=rows))
