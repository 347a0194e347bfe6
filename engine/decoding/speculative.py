"""The speculative cycle over a batch of rows: propose → verify → accept → sync.

Each row has its depth (fixed, or the auto rows' controller's choice for this batch size),
drafts (``proposer``), ONE trunk forward verifies every row's [x0, d1..dk] (shallower rows
padded after their tokens), acceptance runs per row (``acceptance``) and ONE host sync reads
every row's result. Committing and emitting are the decoder's (``decoder.BatchDecoder``), the
same for this cycle and the plain pipeline.

Timing: without ``profile`` the draft/verify/accept times are the host time spent building
those graphs and ``t_sync`` the wait in the one synchronisation (where the work of every phase
finishes); with ``profile`` each phase is evaluated on its own (4 syncs), so the phase times
are true costs and ``t_sync`` is 0.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx

from engine.decoding import acceptance, proposer
from engine.decoding.batch_caches import Batch
from engine.decoding.plan import Cycle, RowResult
from engine.decoding.stream import Stream
from engine.depth.controller import AdaptiveDepth


def depths(streams: list[Stream], controller: AdaptiveDepth | None,
           chosen: tuple[int, str] | None = None) -> tuple[list[int], list[str]]:
    """Each row's depth this cycle and why (never past its budget's last token); the auto
    rows' is ``chosen`` (the controller's choice made ahead), else the controller's now."""
    auto = chosen or (controller.choose() if controller is not None else None)
    ks, reasons = [], []
    for st in streams:
        k, reason = auto if st.depth == "auto" else (st.depth, "fixed")
        ks.append(max(0, min(int(k), st.reply.remaining - 1)))
        reasons.append(reason)
    return ks, reasons


def launch(batch: Batch, streams: list[Stream], controller: AdaptiveDepth | None, *,
           profile: bool = False, share=None, chosen: tuple[int, str] | None = None) -> Cycle:
    """Depths, drafts (started computing) and the verify forward (lazy); ``share`` (a
    cluster's): the verify runs on rank 0's drafts on every rank; ``chosen``: the auto rows'
    depth, chosen ahead."""
    t0 = time.perf_counter()
    ks, reasons = depths(streams, controller, chosen)
    c = Cycle(ks=ks, reasons=reasons, proposals=[], t0=t0, controller=controller)
    x0s = [st.x0 for st in streams]
    c.proposals = proposer.propose(batch, [st.row for st in streams], x0s, c)
    drafted = [c.grid] if c.grid is not None else [p.tokens for p in c.proposals if p]
    if drafted:
        (mx.eval if profile else mx.async_eval)(drafted)
    t1 = time.perf_counter()
    inputs = _inputs(x0s, c)
    if share is not None and max(c.ks) > 0:
        inputs = share.drafts(inputs)
    c.ver = batch.verify(inputs)
    (mx.eval if profile else mx.async_eval)(c.ver.logits)
    c.t_draft, c.t_verify = t1 - t0, time.perf_counter() - t1
    return c


def _inputs(x0s: list[int], c: Cycle) -> mx.array:
    """[B, max k + 1]: each row's x0 and drafts, padded after them."""
    first = mx.array([[x] for x in x0s], dtype=mx.int32)
    if max(c.ks) == 0:
        return first
    if c.grid is not None:  # the head's drafts, all rows at once (padding included)
        return mx.concatenate([first, c.grid], axis=1)
    S, rows = max(c.ks) + 1, []
    for x0, k, p in zip(x0s, c.ks, c.proposals):
        parts = [mx.array([x0], dtype=mx.int32)]
        if p is not None:
            parts.append(p.tokens.astype(mx.int32))
        if S - 1 - k:
            parts.append(mx.zeros((S - 1 - k,), dtype=mx.int32))
        rows.append(mx.concatenate(parts) if len(parts) > 1 else parts[0])
    return mx.stack(rows)


def run(batch: Batch, streams: list[Stream], controller: AdaptiveDepth | None,
        plain_key: Callable[[Stream], mx.array], *, profile: bool = False, share=None,
        chosen: tuple[int, str] | None = None) -> tuple[Cycle, list[RowResult], dict]:
    """One cycle up to its host sync; returns it, each row's result and its times. With
    ``share`` (a cluster's) every rank then takes rank 0's results: one decision."""
    c = launch(batch, streams, controller, profile=profile, share=share, chosen=chosen)
    fast = [st.row.greedy_fast for st in streams]
    if any(fast):
        c.target = mx.argmax(c.ver.logits, axis=-1).astype(mx.int32)
    grouped = c.grouped
    verdicts = [None if f or b in grouped else
                acceptance.accept_row(streams[b], b, c, plain_key)
                for b, f in enumerate(fast)]
    for g in c.groups:
        acceptance.accept_group(g, streams, c)
    if profile:
        mx.eval(acceptance.lazy_outputs(c, verdicts))
    t_accept = time.perf_counter()

    def redo(b: int, key):
        return acceptance.accept_row(streams[b], b, c, plain_key, key=key, dense=True)

    results = acceptance.sync(c, verdicts, redo)
    if share is not None:
        results = share.results(results)
    t_sync = time.perf_counter()
    times = dict(t_draft=c.t_draft, t_verify=c.t_verify,
                 t_accept=t_accept - c.t0 - c.t_draft - c.t_verify,
                 t_sync=0.0 if profile else t_sync - t_accept)
    if profile:
        times["t_accept"] = t_sync - c.t0 - c.t_draft - c.t_verify
    return c, results, times
