"""Plain decoding, pipelined: a batch whose rows all decode at depth 0 with their tokens drawn
on the device (no penalties, no grammar) queues each step on the previous step's lazy tokens
before reading them, as mlx-lm's generation does, so building the next graph overlaps the
current one's compute. ``auto`` rows ride it while their controller keeps choosing depth 0:
the next cycle's depth is chosen before its step is queued (``PlainPipeline.cycle``'s
``ahead``), and a cycle that drafts queues nothing ahead (no step is rewound for it).

A row that finishes or is cancelled leaves the queued step (the prompt cache gets its state
from before it: ``mark``); the step is rewound (``settle``; each row's key kept for the
redo) when a stream is about to join or a row's compact draw tied at the top-k boundary and is
redrawn densely (its token changes).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from engine.decoding import draw
from engine.decoding.batch_caches import Batch, BatchVerified
from engine.decoding.plan import Cycle, RowResult
from engine.decoding.stream import Stream


@dataclass
class PlainStep:
    """A queued plain step: its verify over [B, 1], each row's token (lazy, [B]), the key
    each row drew it with (None: greedy), the compact sampler's ``exact`` flags, and the
    trunk state before it (``Batch.mark``) to rewind to."""

    ver: BatchVerified
    y: mx.array
    keys: list
    exact: list
    mark: list

    def rows(self, keep: list[int]) -> "PlainStep":
        """The step for rows ``keep`` only (the others left the batch)."""
        idx = mx.array(keep, dtype=mx.int32)
        ver = BatchVerified(hidden=mx.take(self.ver.hidden, idx, axis=0),
                            logits=mx.take(self.ver.logits, idx, axis=0), captures={})
        return PlainStep(ver=ver, y=mx.take(self.y, idx), keys=[self.keys[b] for b in keep],
                         exact=[self.exact[b] for b in keep],
                         mark=Batch.take_mark(self.mark, keep))


def pipelined(streams: list[Stream], *, auto: bool = False) -> bool:
    """Every row decodes plainly with its token drawn on the device (``auto``: or is an
    ``auto`` row, whose controller chose depth 0 for this cycle)."""
    return all((st.plain or auto and st.depth == "auto") and st.row.constraint is None
               and st.reply.counts is None for st in streams)


class PlainPipeline:
    """The queued plain step of one batch and the keys of a rewound one."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.ahead: PlainStep | None = None   # the next plain step, already queued
        self.carry: dict[str, mx.array] = {}  # keys of a rewound plain step, by stream id
        self.t_last = 0.0                     # when the last plain cycle ended

    def key_for(self, st: Stream) -> mx.array:
        """A sampled plain row's key for its next token: the one a rewound plain step drew
        for it, else its next."""
        key = self.carry.pop(st.id, None)
        return next(st.row.keys) if key is None else key

    def settle(self, streams: list[Stream]) -> None:
        """Rewind the queued step, if any: each row's key is kept for its redo."""
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return
        self.batch.rewind(ahead.mark)
        for st, key in zip(streams, ahead.keys):
            if key is not None:
                self.carry[st.id] = key

    def leave(self, keep: list[int]) -> None:
        """Rows other than ``keep`` left the batch: the queued step goes on for the others."""
        if self.ahead is not None:
            self.ahead = self.ahead.rows(keep) if keep else None

    def queue(self, streams: list[Stream], x: mx.array) -> PlainStep:
        """Queue one plain step for every row on tokens ``x`` [B] (lazy or not): the verify
        forward and each row's draw (its next key, or the one a rewound step drew)."""
        mark = self.batch.mark()
        ver = self.batch.verify(x.reshape(-1, 1))
        logits = ver.logits[:, 0]
        greedy = mx.argmax(logits, axis=-1).astype(mx.int32)
        ys, keys, exact = [], [], []
        for b, st in enumerate(streams):
            r = st.row
            key = None if r.params.greedy else self.key_for(st)
            y, e = (greedy[b:b + 1], None) if key is None else \
                draw.pick(logits[b:b + 1], r.params, None, key)
            ys.append(y.reshape(1).astype(mx.int32))
            keys.append(key)
            exact.append(e)
        y = greedy if all(k is None for k in keys) else mx.concatenate(ys)
        mx.async_eval([y] + [e for e in exact if e is not None])
        return PlainStep(ver=ver, y=y, keys=keys, exact=exact, mark=mark)

    def cycle(self, streams: list[Stream], *, joining: bool,
              ahead: Callable[[], bool] | None = None) -> tuple[Cycle, list[RowResult], dict]:
        """One token for every row: the step queued by the cycle before (else queued now),
        the next step queued on its lazy tokens (unless a stream is ``joining``, or
        ``ahead()`` says the next cycle is not a plain one), then one read. Returns the
        cycle, each row's token and the times so far."""
        t0 = time.perf_counter()
        cur, self.ahead = self.ahead, None
        start = t0 if cur is None else self.t_last  # a queued step ran since the last read
        if cur is None:
            cur = self.queue(streams, mx.array([st.x0 for st in streams], dtype=mx.int32))
        if not joining and (ahead is None or ahead()):
            self.ahead = self.queue(streams, cur.y)
        t_queued = time.perf_counter()
        tokens = cur.y.tolist()
        for b, exact in enumerate(cur.exact):
            if exact is not None and not exact.item():
                self.settle(streams)
                r = streams[b].row
                y, _ = draw.pick(cur.ver.logits[b, :1], r.params, None, cur.keys[b],
                                 dense=True)
                tokens[b] = int(y.item())
        n = len(streams)
        c = Cycle(ks=[0] * n, reasons=["fixed"] * n, proposals=[None] * n, ver=cur.ver,
                  t0=start)
        times = dict(t_verify=t_queued - t0, t_sync=time.perf_counter() - t_queued)
        return c, [RowResult(0, t, []) for t in tokens], times
