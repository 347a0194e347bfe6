"""Continuous batching with speculation at any depth: ``BatchDecoder``.

Up to ``max_streams`` streams decode together, each with its own prompt, sampling, seed, stop
strings, depth (fixed or auto, with its own ``AdaptiveDepth``), budget and cancel flag. Each
``step()`` does at most

1. one prefill chunk of the stream at the head of the waiting line (``Session.prefill_chunks``,
   its prompt cache reused) — when its prompt is done it draws its first token and joins the
   batch (``engine.batch.Batch.join``), so a long new prompt stalls the others for one chunk;
2. one batched cycle of ``engine.cycle``'s four steps over every joined row: the MTP head
   drafts for all rows at once (one head forward per draft step), ONE trunk forward verifies
   all rows' [x0, d1..dk] (shallower rows padded), acceptance runs per row with the row's own
   parameters and random keys (``cycle.accept``; rows that share parameters and depth draw
   and accept in one compiled call each, ``_Group``), ONE host synchronisation reads every
   row's result, and each row commits its own accepted length (``Batch.commit``).

Exactness per stream: a row's drafts and acceptance use the same functions, the same keys in
the same order and the same logits (up to float rounding of the batched matmuls) as it would
alone — ``engine.decode`` draws the first token with the first key, a draft of k tokens uses the
next key split k ways, acceptance the next; a depth-0 stream samples each token like
``decode.run_plain`` (one key per token). So a seeded stream gives the same tokens batched or
alone, and greedy streams equal their single-stream output.

A batch whose rows all decode plainly (fixed depth 0, no penalties, no grammar: a model
without an MTP head, or clients asking for depth 0) is pipelined as ``decode.run_plain`` is:
each step is queued on the previous step's lazy tokens before those are read, so building the
next graph overlaps the current one's compute (what mlx-lm's generation relies on with a GPU;
on this project's 2-core CPU, paired runs of a lone depth-0 request through the batch went from
0.79-1.00x ``Model.generate`` to 0.94-1.05x, within this machine's noise: there MLX's
``async_eval`` of a demo decode step itself takes 3.6 ms of its ~4.6, against 0.6 ms to build
the graph, so little is left to overlap). A row that finishes or is cancelled leaves the queued step
(the prompt cache gets its state from before it); the step is rewound (``Batch.rewind``; each
row's key kept for the redo) when a stream joins or a row's compact draw tied.

A structured-output stream (``constraint``) speculates too: its drafts are drawn under the
grammar's mask, which needs its previous drafts on the host, so a cycle with such a row reads
each draft step's tokens back before the next (one host wait per draft step, for that cycle
only); its acceptance masks every verified row (``cycle.accept``), as alone.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import mlx.core as mx

from engine import candidates, cycle, decode, grammar
from engine.adaptive import AdaptiveDepth
from engine.batch import Batch, BatchVerified
from engine.drafters import (Drafter, DraftRequest, Proposal, draft_counts, pick_draft,
                             stack_q)
from engine.errors import GenerationError
from engine.grammar import Constraint
from engine.reply import Reply
from engine.session import Session, Snapshot, Verified
from engine.types import CycleStats, Depth, DraftMode, Event, PrefillStats, SamplingParams

log = logging.getLogger(__name__)

DEFAULT_STREAMS = 8
_ids = itertools.count(1)


@dataclass
class Stream:
    """One request in a ``BatchDecoder``: its reply and decode state."""

    id: str
    prompt: list[int]
    row: cycle.Row                      # ``row.session`` is None: the caches are the batch's
    depth: Depth
    submitted: float = field(default_factory=time.perf_counter)
    session: Session | None = None      # while prefilling
    prefill: Iterator[int] | None = None
    reused: int = 0
    x0: int = -1                        # the pending token (emitted, not yet fed)
    after_prompt: Snapshot | None = None
    lineage: int = 0                    # its prompt-cache lineage (``session.PromptCache``)
    finished: bool = False

    @property
    def reply(self) -> Reply:
        return self.row.reply

    @property
    def plain(self) -> bool:
        """A fixed depth-0 stream: sampled token by token like ``decode.run_plain``."""
        return self.depth == 0


@dataclass
class _Cycle:
    """One batched cycle in flight: each row's depth, draft and the verify forward."""

    ks: list[int]
    reasons: list[str]
    proposals: list[Proposal | None]
    inputs: list[list[int]] = field(default_factory=list)  # host ids, filled at the sync
    grid: mx.array | None = None    # [B, max k] every row's head drafts (MTP), padding included
    target: mx.array | None = None  # [B, S] verify argmax (when some row is greedy)
    ver: BatchVerified | None = None
    t0: float = 0.0
    controller: AdaptiveDepth | None = None  # the auto rows' (``BatchDecoder._controller``)
    t_draft: float = 0.0
    t_verify: float = 0.0
    groups: list[_Group] = field(default_factory=list)

    @property
    def grouped(self) -> set[int]:
        """The rows that draft and accept in a ``_Group``."""
        return {b for g in self.groups for b in g.rows}


@dataclass
class _Group:
    """Rows of one cycle that draft and accept together: the same sampling parameters (no
    penalties, no grammar, compact candidates) and the same depth k >= 1. Each draft step is
    one ``candidates.compiled_draft_rows`` call and the acceptance one
    ``compiled_accept_rows`` call for all of them, each row with its own keys, so each gets
    what it would get alone; nothing is sliced per row until the host reads the results."""

    params: SamplingParams
    k: int
    rows: list[int]
    draft_keys: mx.array | None = None  # [R, k, 2]
    ids: list[mx.array] = field(default_factory=list)    # per draft step: q ids [R, K]
    probs: list[mx.array] = field(default_factory=list)  # q probs [R, K]
    exact: list[mx.array] = field(default_factory=list)  # [R]
    keys: mx.array | None = None        # acceptance keys [R, 2]
    verdict: tuple = ()                 # (n, extra, all target rows exact), each [R], lazy

    @property
    def index(self) -> mx.array:
        return mx.array(self.rows, dtype=mx.int32)

    def q(self, i: int) -> candidates.Candidates:
        """Row i's q rows [k, K] (for a dense redo)."""
        return candidates.Candidates(mx.stack(self.ids, axis=1)[i],
                                     mx.stack(self.probs, axis=1)[i],
                                     mx.stack(self.exact, axis=1)[i])


@dataclass
class _PlainStep:
    """A queued step of a batch whose rows all decode plainly (``BatchDecoder._pipelined``):
    its verify over [B, 1], each row's token (lazy, [B]), the key each row drew it with (None:
    greedy), the compact sampler's ``exact`` flags, and the trunk state before it
    (``Batch.mark``) to rewind to when it will not be used as queued."""

    ver: BatchVerified
    y: mx.array
    keys: list
    exact: list
    mark: list

    def rows(self, keep: list[int]) -> "_PlainStep":
        """The step for rows ``keep`` only (the others left the batch)."""
        idx = mx.array(keep, dtype=mx.int32)
        ver = BatchVerified(hidden=mx.take(self.ver.hidden, idx, axis=0),
                            logits=mx.take(self.ver.logits, idx, axis=0), captures={})
        return _PlainStep(ver=ver, y=mx.take(self.y, idx), keys=[self.keys[b] for b in keep],
                          exact=[self.exact[b] for b in keep],
                          mark=Batch.take_mark(self.mark, keep))


@dataclass
class _Drafts:
    """Every row's drafts so far in one batched draft (``BatchDecoder._draft_mtp``)."""

    keys: list[mx.array | None]     # row b's keys [k, 2] for its draft steps (None: greedy)
    tokens: list[list[mx.array]]
    qs: list[list]                  # the q rows they were drawn from (none when argmax)
    host: list[list[int]]           # a constrained row's drafts on the host (for its masks)


class BatchDecoder:
    """See the module docstring. Not thread-safe: one thread calls ``add`` and ``step``."""

    def __init__(self, model, *, max_streams: int = DEFAULT_STREAMS, use_mtp: bool = True,
                 draft_mode: DraftMode = "filtered") -> None:
        if max_streams < 1:
            raise GenerationError(f"max_streams must be at least 1, not {max_streams}")
        self.model = model
        self.max_streams = max_streams
        self.draft_mode = draft_mode
        self.batch = Batch(model, use_mtp=use_mtp)
        self.waiting: deque[Stream] = deque()
        self.joining: Stream | None = None
        self.active: list[Stream] = []   # the batch's rows, in row order
        self.cycles = 0
        self._ahead: _PlainStep | None = None  # the next plain step, already queued
        self._carry: dict[str, mx.array] = {}  # keys of a rewound plain step, by stream id
        self._t_last = 0.0  # when the last plain cycle ended

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.joining or self.active)

    # -- adding streams ---------------------------------------------------------------------
    def add(self, prompt_ids, *, max_tokens: int = 256, depth: Depth = "auto",
            sampling: SamplingParams | None = None, seed: int | None = None,
            cancel: threading.Event | None = None, stop_strings: tuple[str, ...] = (),
            drafter: Drafter | None = None, constraint: Constraint | None = None,
            id: str | None = None) -> Stream:
        """Queue a stream (checked like ``Model.generate``, raising ``GenerationError``)."""
        params = SamplingParams() if sampling is None else sampling
        model = self.model
        prompt = decode.check_prompt(model, prompt_ids)
        budget = decode.check_request(model, prompt, max_tokens=max_tokens, depth=depth,
                                      sampling=params, stop_strings=stop_strings,
                                      drafter=drafter, draft_mode=self.draft_mode)
        if drafter is not None and self.batch.use_mtp:
            raise GenerationError("a batch drafts with the MTP head or with each stream's own "
                                  "drafter, not both: make it with use_mtp=False")
        if depth != 0 and drafter is None and not self.batch.use_mtp:
            raise GenerationError("this batch has no MTP head to draft with: use depth 0")
        reply = Reply(tokenizer=model.tokenizer, eos=model.info.eos_token_ids, budget=budget,
                      stop_strings=tuple(stop_strings), vocab_size=model.info.vocab_size,
                      penalties=params.presence_penalty != 0 or params.frequency_penalty != 0,
                      cancel=cancel)
        row = cycle.Row(session=None, drafter=drafter, reply=reply, params=params,
                        keys=decode._keys(seed), constraint=constraint)
        st = Stream(id=id or f"stream-{next(_ids)}", prompt=prompt, row=row, depth=depth)
        self.waiting.append(st)
        return st

    def _controller(self, rows: int) -> AdaptiveDepth:
        """The depth controller of the auto rows while ``rows`` streams decode together.

        A padded verify costs the same for every row, so the depth that maximises the
        aggregate speed is one decision for the batch: auto rows share a controller per batch
        size (acceptance pooled over them, cycle time of the whole batch). The one for a lone
        stream is the model's own (``Model.depth_controller``, shared with ``Model.generate``,
        so what it learnt carries over); the others live on the model too
        (``Model.batch_controllers``). A new one starts from what the controller of the
        nearest batch size learnt (acceptance, cycle costs, depth), so it needs no warm-up:
        as streams finish, a batch passes through every size below its largest, and warming
        up each one visited every depth in turn."""
        model = self.model
        max_d = min(model.info.max_depth or 3, decode.AUTO_MAX_DEPTH)
        if rows == 1:
            if model.depth_controller is None or model.depth_controller.max_depth != max_d:
                model.depth_controller = decode._controller(model, None)
            return model.depth_controller
        c = model.batch_controllers.get(rows)
        if c is None or c.max_depth != max_d:
            known = {n: k for n, k in model.batch_controllers.items() if k.max_depth == max_d}
            if model.depth_controller is not None and model.depth_controller.max_depth == max_d:
                known[1] = model.depth_controller
            near = min(known, key=lambda n: (abs(n - rows), n), default=None)
            c = AdaptiveDepth(max_d, initial=None if near is None else known[near].state())
            model.batch_controllers[rows] = c
        return c

    # -- one step -------------------------------------------------------------------------------
    def step(self) -> list[tuple[Stream, Event]]:
        """``admit_step()`` then ``cycle_step()``; returns their events, in order."""
        return self.admit_step() + self.cycle_step()

    def admit_step(self) -> list[tuple[Stream, Event]]:
        """End cancelled streams and run one prefill chunk (if a stream waits and a row is
        free): a stream whose prompt is done gets its first token here and joins the batch.
        (Callers that deliver events hand these out before the cycle: a joining stream's time
        to first token is its prefill chunk, not the cycle after it.)"""
        return self._drop_cancelled() + self._prefill_step()

    def cycle_step(self) -> list[tuple[Stream, Event]]:
        """One batched cycle over the joined rows (none: nothing)."""
        return self._cycle() if self.active else []

    def run(self) -> Iterator[tuple[Stream, Event]]:
        """``step()`` until every stream has finished."""
        while self.busy:
            yield from self.step()

    def _drop_cancelled(self) -> list[tuple[Stream, Event]]:
        out = []
        for st in [s for s in self.waiting if s.reply.cancelled]:
            self.waiting.remove(st)
            out.append(self._end(st, st.reply.cancel_event()))
        if self.joining is not None and self.joining.reply.cancelled:
            st, self.joining = self.joining, None
            out.append(self._end(st, st.reply.cancel_event()))
        gone = [b for b, st in enumerate(self.active) if st.reply.cancelled]
        for b in gone:
            out.append(self._end(self.active[b], self.active[b].reply.cancel_event(), row=b))
        self._leave(gone)
        return out

    def _end(self, st: Stream, ev: Event, *, row: int | None = None) -> tuple[Stream, Event]:
        """``st`` is done with ``ev``; its final state goes to the prompt cache."""
        st.finished = True
        self._carry.pop(st.id, None)
        ahead = None if self._ahead is None else self._ahead.mark  # its state before that
        session = st.session if row is None else self.batch.extract(row, ahead)
        if row is not None:  # the same conversation: its snapshots replace each other
            session.lineage = st.lineage
        if session is not None and st.after_prompt is not None:
            decode._keep(self.model, st.after_prompt, session.snapshot())
        st.session = st.prefill = None
        return st, ev

    def _leave(self, rows: list[int]) -> None:
        """Remove ``rows``; a queued plain step goes on for the others."""
        if rows:
            self.batch.leave(rows)
            keep = [b for b in range(len(self.active)) if b not in set(rows)]
            self.active = [self.active[b] for b in keep]
            if self._ahead is not None:
                self._ahead = self._ahead.rows(keep) if keep else None

    # -- joining: chunked prefill, first token ----------------------------------------------------
    def _prefill_step(self) -> list[tuple[Stream, Event]]:
        if self.joining is None:
            if not self.waiting or len(self.active) >= self.max_streams:
                return []
            self.joining = st = self.waiting.popleft()
            st.session, st.reused = decode._session_for(self.model, st.prompt,
                                                        self.batch.use_mtp)
            rest = st.prompt[st.reused:]
            st.prefill = st.session.prefill_chunks(rest) if rest else iter(())
        st = self.joining
        if next(st.prefill, None) is not None and len(st.session.fed) < len(st.prompt):
            return []  # more chunks to go: the batch runs a cycle meanwhile
        self.joining = None
        return [self._first_token(st)]

    def _first_token(self, st: Stream) -> tuple[Stream, Event]:
        s, row, reply = st.session, st.row, st.reply
        x0 = decode._draw(s.last_logits, row.params, reply.counts, next(row.keys),
                          row.constraint)
        st.after_prompt = s.snapshot()
        self.model.prompt_cache.keep(st.after_prompt)
        prefill = PrefillStats(prompt_tokens=len(st.prompt), reused_tokens=st.reused,
                               seconds=time.perf_counter() - st.submitted)
        ev = reply.emit(*decode._cut(reply, [x0], row.constraint), prefill=prefill)
        if ev.finish_reason is not None:
            return self._end(st, ev)
        st.x0, st.lineage = x0, s.lineage
        self._settle()
        self.batch.join(s, track=st.depth != 0)
        st.session = st.prefill = None
        self.active.append(st)
        # conversations decoded concurrently each keep their own prompt-cache state (a lone
        # chat keeps one, as before)
        pc = self.model.prompt_cache
        pc.max_lineages = max(pc.max_lineages, len(self.active))
        return st, ev

    # -- the batched cycle ----------------------------------------------------------------------
    def _cycle(self) -> list[tuple[Stream, Event]]:
        if self._pipelined():
            return self._plain_cycle()
        self._settle()
        c = self._launch()
        fast = [self._greedy(st) for st in self.active]
        if any(fast):
            c.target = mx.argmax(c.ver.logits, axis=-1).astype(mx.int32)
        grouped = c.grouped
        verdicts = [None if f or b in grouped else self._accept(b, c)
                    for b, f in enumerate(fast)]
        for g in c.groups:
            self._accept_group(g, c)
        t_accept = time.perf_counter()
        results = self._sync(c, verdicts)
        t_sync = time.perf_counter()
        cut, keeps = [], []
        for st, (n, extra, drafted) in zip(self.active, results):
            tokens, reason = st.reply.cut(drafted[:n] + [extra])
            if st.row.constraint is not None:
                st.row.constraint.advance(tokens)
            cut.append((tokens, reason))
            keeps.append(min(n, len(tokens)))
            c.inputs.append([st.x0] + drafted)
        self.batch.commit(c.inputs, keeps, c.ver,
                          drafted=self.batch.use_mtp and max(c.ks) > 0)
        now = time.perf_counter()
        times = dict(t_draft=c.t_draft, t_verify=c.t_verify, t_accept=t_accept - c.t0
                     - c.t_draft - c.t_verify, t_sync=t_sync - t_accept, t_commit=now - t_sync,
                     t_total=now - c.t0)
        self.cycles += 1
        return self._emit(c, results, cut, times)

    # -- every row plain: pipelined like ``decode.run_plain`` --------------------------------
    def _pipelined(self) -> bool:
        """Every row decodes plainly with its token drawn on the device (fixed depth 0, no
        penalties, no grammar): then each step is queued before the one before it is read,
        as ``decode.run_plain`` does, instead of one cycle after another."""
        return all(st.plain and st.row.constraint is None and st.reply.counts is None
                   for st in self.active)

    def _plain_cycle(self) -> list[tuple[Stream, Event]]:
        """One token for every row: the step queued by the cycle before (else queued now),
        the next step queued on its lazy tokens, then one read. A row that finishes or is
        cancelled leaves the queued step (its state before it goes to the prompt cache); the
        step is rewound (``_settle``) when a stream joins or a row's compact draw tied at the
        top-k boundary and is redrawn densely (its token changes)."""
        t0 = time.perf_counter()
        cur, self._ahead = self._ahead, None
        start = t0 if cur is None else self._t_last  # a queued step ran since the last read
        if cur is None:
            cur = self._queue_plain(mx.array([st.x0 for st in self.active], dtype=mx.int32))
        joins = bool(self.waiting) and len(self.active) < self.max_streams
        if not joins and self.joining is None:
            self._ahead = self._queue_plain(cur.y)
        t_queued = time.perf_counter()
        tokens = cur.y.tolist()
        for b, exact in enumerate(cur.exact):
            if exact is not None and not exact.item():
                self._settle()
                r = self.active[b].row
                y, _ = decode._pick(cur.ver.logits[b, :1], r.params, None, cur.keys[b],
                                    dense=True)
                tokens[b] = int(y.item())
        t_sync = time.perf_counter()
        self.batch.commit([[st.x0] for st in self.active], [0] * len(tokens), cur.ver,
                          drafted=False)  # what the step fed: each row's x0
        cut = [st.reply.cut([t]) for st, t in zip(self.active, tokens)]
        now = time.perf_counter()
        n = len(self.active)
        c = _Cycle(ks=[0] * n, reasons=["fixed"] * n, proposals=[None] * n)
        times = dict(t_verify=t_queued - t0, t_sync=t_sync - t_queued, t_commit=now - t_sync,
                     t_total=now - start)
        self._t_last = now
        self.cycles += 1
        return self._emit(c, [(0, t, []) for t in tokens], cut, times)

    def _queue_plain(self, x: mx.array) -> _PlainStep:
        """Queue one plain step for every row on tokens ``x`` [B] (lazy or not): the verify
        forward and each row's draw as ``decode.run_plain`` makes it (its next key, or the
        one a rewound step drew)."""
        mark = self.batch.mark()
        ver = self.batch.verify(x.reshape(-1, 1))
        logits = ver.logits[:, 0]
        greedy = mx.argmax(logits, axis=-1).astype(mx.int32)
        ys, keys, exact = [], [], []
        for b, st in enumerate(self.active):
            r = st.row
            key = None if r.params.greedy else self._plain_key(st)
            y, e = (greedy[b:b + 1], None) if key is None else \
                decode._pick(logits[b:b + 1], r.params, None, key)
            ys.append(y.reshape(1).astype(mx.int32))
            keys.append(key)
            exact.append(e)
        y = greedy if all(k is None for k in keys) else mx.concatenate(ys)
        mx.async_eval([y] + [e for e in exact if e is not None])
        return _PlainStep(ver=ver, y=y, keys=keys, exact=exact, mark=mark)

    def _plain_key(self, st: Stream) -> mx.array:
        """A sampled plain row's key for its next token: the one a rewound plain step drew
        for it (``_settle``), else its next."""
        key = self._carry.pop(st.id, None)
        return next(st.row.keys) if key is None else key

    def _settle(self) -> None:
        """Rewind the queued plain step, if any: each row's key is kept for its redo."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        self.batch.rewind(ahead.mark)
        for st, key in zip(self.active, ahead.keys):
            if key is not None:
                self._carry[st.id] = key

    def _emit(self, c: _Cycle, results, cut, times: dict) -> list[tuple[Stream, Event]]:
        out, done = [], []
        for b, st in enumerate(self.active):
            n, extra, drafted = results[b]
            tokens, reason = cut[b]
            stats = CycleStats(
                index=st.reply.next_cycle(), depth=c.ks[b], drafted=tuple(drafted),
                accepted=n, emitted=tuple(tokens),
                from_draft=tuple(i < n for i in range(len(tokens))),
                extra_kind="plain" if st.plain else cycle._extra_kind(len(tokens), n, c.ks[b]),
                context_tokens=len(self.batch.fed[b]), depth_reason=c.reasons[b],
                batch_rows=len(self.active), **times)
            if c.controller is not None and st.depth == "auto":
                c.controller.observe(stats, timed=False,  # each auto row's acceptance, and
                                     position=len(st.reply.generated) - 1)  # its opening
            ev = st.reply.emit(tokens, reason, stats=stats)
            st.x0 = extra
            if ev.finish_reason is not None:
                out.append(self._end(st, ev, row=b))
                done.append(b)
            else:
                out.append((st, ev))
        if c.controller is not None:  # the cycle's time, once, at the depth it was padded to
            c.controller.observe_time(max(c.ks), times["t_total"])
        self._leave(done)
        return out

    def _depth(self, st: Stream, auto: tuple[int, str] | None) -> tuple[int, str]:
        k, reason = auto if st.depth == "auto" else (st.depth, "fixed")
        return max(0, min(int(k), st.reply.remaining - 1)), reason

    def _launch(self) -> _Cycle:
        """Depths, drafts (started computing) and the verify forward (lazy)."""
        t0 = time.perf_counter()
        ctrl = None
        if any(st.depth == "auto" for st in self.active):
            ctrl = self._controller(len(self.active))
        auto = ctrl.choose() if ctrl is not None else None
        chosen = [self._depth(st, auto) for st in self.active]
        ks = [k for k, _ in chosen]
        c = _Cycle(ks=ks, reasons=[r for _, r in chosen], proposals=[], t0=t0, controller=ctrl)
        c.proposals = self._draft(ks, c)
        if c.grid is not None:
            mx.async_eval(c.grid)
        t1 = time.perf_counter()
        c.ver = self.batch.verify(self._inputs(c))
        mx.async_eval(c.ver.logits)
        c.t_draft, c.t_verify = t1 - t0, time.perf_counter() - t1
        return c

    def _inputs(self, c: _Cycle) -> mx.array:
        """[B, max k + 1]: each row's x0 and drafts, padded after them."""
        x0s = mx.array([[st.x0] for st in self.active], dtype=mx.int32)
        if max(c.ks) == 0:
            return x0s
        if c.grid is not None:  # the head's drafts, all rows at once (padding included)
            return mx.concatenate([x0s, c.grid], axis=1)
        S, rows = max(c.ks) + 1, []
        for st, k, p in zip(self.active, c.ks, c.proposals):
            parts = [mx.array([st.x0], dtype=mx.int32)]
            if p is not None:
                parts.append(p.tokens.astype(mx.int32))
            if S - 1 - k:
                parts.append(mx.zeros((S - 1 - k,), dtype=mx.int32))
            rows.append(mx.concatenate(parts) if len(parts) > 1 else parts[0])
        return mx.stack(rows)

    @staticmethod
    def _greedy(st: Stream) -> bool:
        """Greedy without penalties or a grammar: its acceptance is the verify argmax against
        its drafts, read on the host for every such row at once."""
        r = st.row
        return r.params.greedy and r.reply.counts is None and r.constraint is None

    def _draft(self, ks: list[int], c: _Cycle) -> list[Proposal | None]:
        if max(ks) == 0:
            return [None] * len(ks)
        if self.batch.use_mtp:
            return self._draft_mtp(ks, c)
        out: list[Proposal | None] = []
        for st, k in zip(self.active, ks):
            r = st.row
            out.append(None if k == 0 else r.drafter.draft(DraftRequest(
                x0=st.x0, k=k, generated=r.reply.generated, params=r.params,
                counts=r.reply.counts, key=None if r.params.greedy else next(r.keys),
                allowed=r.constraint.allowed if r.constraint else None)))
        return out

    def _draft_mtp(self, ks: list[int], c: _Cycle) -> list[Proposal | None]:
        """The MTP head drafts for every row at once: ``max(ks)`` head forwards over [B, ·];
        row b samples its first ``ks[b]`` drafts exactly as ``MTPDrafter`` would. Sets
        ``c.grid`` [B, max k]: each step's tokens (a row past its depth carries filler), and
        ``c.groups`` (rows drawn together; their proposals are None: see ``_Group``)."""
        rows = [st.row for st in self.active]
        keys = [None if k == 0 or r.params.greedy else mx.random.split(next(r.keys), k)
                for r, k in zip(rows, ks)]
        greedy = all(self._greedy(st) for st in self.active)
        drafts = _Drafts(keys=keys, tokens=[[] for _ in rows], qs=[[] for _ in rows],
                         host=[[] for _ in rows])
        out = self.batch.mtp_first([st.x0 for st in self.active])
        columns = []
        for j in range(max(ks)):
            logits = self.batch.logits(out[:, -1])  # [B, V]
            if greedy:  # argmax for every row at once (what MTPDrafter takes when greedy)
                col = mx.argmax(logits, axis=-1).astype(mx.int32)
            else:
                c.groups = self._groups(rows, ks, keys, logits) if j == 0 else c.groups
                col = self._column(rows, ks, j, logits, drafts, c)
            columns.append(col)
            if j + 1 < max(ks):
                out = self.batch.mtp_next(out, col)
        c.grid = mx.stack(columns, axis=1)
        grouped = c.grouped
        return [Proposal(tokens=c.grid[b, :k] if greedy else mx.stack(drafts.tokens[b]),
                         q=stack_q(drafts.qs[b])) if k and b not in grouped else None
                for b, k in enumerate(ks)]

    def _groups(self, rows: list[cycle.Row], ks: list[int], keys: list,
                logits: mx.array) -> list[_Group]:
        """The cycle's ``_Group``s of two rows or more."""
        by: dict[tuple[SamplingParams, int], list[int]] = {}
        for b, (r, k) in enumerate(zip(rows, ks)):
            if k and r.constraint is None and r.reply.counts is None and \
                    self._compact(r.params, logits):
                by.setdefault((r.params, k), []).append(b)
        return [_Group(params=p, k=k, rows=bs, draft_keys=mx.stack([keys[b] for b in bs]))
                for (p, k), bs in by.items() if len(bs) > 1]

    def _column(self, rows: list[cycle.Row], ks: list[int], j: int, logits: mx.array,
                drafts: _Drafts, c: _Cycle) -> mx.array:
        """Draft step j of every row [B] (0 past a row's depth): each of ``c.groups`` in one
        call, every other row as ``MTPDrafter`` draws it."""
        grouped = c.grouped
        idx, vals = [], []
        for b, (r, k) in enumerate(zip(rows, ks)):
            if j < k and b not in grouped:
                idx.append(mx.array([b], dtype=mx.int32))
                vals.append(self._pick(r, logits[b:b + 1], drafts, b, j)[None])
        for g in c.groups:
            if j >= g.k:
                continue
            whole = len(g.rows) == len(rows)
            tok, ids, probs, exact = candidates.compiled_draft_rows(g.params)(
                logits if whole else mx.take(logits, g.index, axis=0), g.draft_keys[:, j])
            g.ids.append(ids)
            g.probs.append(probs)
            g.exact.append(exact)
            if whole:
                return tok
            idx.append(g.index)
            vals.append(tok)
        col = mx.zeros((len(rows),), dtype=mx.int32)
        return col.at[mx.concatenate(idx)].add(mx.concatenate(vals)) if idx else col

    def _compact(self, params: SamplingParams, logits: mx.array) -> bool:
        """Whether ``pick_draft`` would draw with ``candidates.compiled_draft`` (and
        ``cycle.accept`` accept with ``compiled_accept``)."""
        return (self.draft_mode == "filtered" and not params.greedy
                and candidates.applies(params, logits.shape[-1], logits.dtype))

    def _pick(self, r: cycle.Row, logits: mx.array, drafts: _Drafts, b: int,
              j: int) -> mx.array:
        """Row b's draft j from the head's logits [1, V], as ``MTPDrafter`` draws it: under
        its grammar's mask after its drafts so far (read back to the host for that)."""
        if r.constraint is not None:
            logits = grammar.masked(logits, r.constraint.allowed(drafts.host[b]))
        d, q = pick_draft(logits, r.params, draft_counts(r.reply.counts, drafts.tokens[b]),
                          None if drafts.keys[b] is None else drafts.keys[b][j], self.draft_mode)
        drafts.tokens[b].append(d)
        if q is not None:
            drafts.qs[b].append(q)
        if r.constraint is not None:
            drafts.host[b].append(int(d.item()))
        return d

    def _accept(self, b: int, c: _Cycle, *, key: mx.array | None = None,
                dense: bool = False) -> cycle.Verdict:
        """Row b's acceptance (lazy); ``dense`` redoes it with the same ``key`` after a
        top-k tie."""
        st, k, r = self.active[b], c.ks[b], self.active[b].row
        logits = c.ver.logits[b, :k + 1]
        if st.plain:  # one token, drawn as decode.run_plain draws it
            if key is None and not r.params.greedy:
                key = self._plain_key(st)
            if r.constraint is not None:
                logits = grammar.masked(logits, r.constraint.allowed())
            y, exact = decode._pick(logits, r.params, r.reply.counts, key, dense=dense)
            return cycle.Verdict(mx.array(0, dtype=mx.int32), y, exact=exact, key=key)
        d = cycle.Draft(x0=st.x0, k=k, reason=c.reasons[b], proposal=c.proposals[b], t0=c.t0,
                        t_draft=0.0)
        ver = Verified(hidden=c.ver.hidden[b:b + 1, :k + 1], logits=logits, captures={})
        return cycle.accept(r, d, ver, key=key, dense=dense)

    def _accept_group(self, g: _Group, c: _Cycle) -> None:
        """The group's acceptance, one call for its rows (lazy), each with its next key."""
        whole = len(g.rows) == len(self.active)
        logits = c.ver.logits if whole else mx.take(c.ver.logits, g.index, axis=0)
        grid = c.grid if whole else mx.take(c.grid, g.index, axis=0)
        g.keys = mx.stack([next(self.active[b].row.keys) for b in g.rows])
        g.verdict = candidates.compiled_accept_rows(g.params)(
            logits[:, :g.k + 1] if logits.shape[1] > g.k + 1 else logits, grid[:, :g.k],
            g.keys, mx.stack(g.ids, axis=1), mx.stack(g.probs, axis=1),
            mx.stack(g.exact, axis=1))

    def _sync(self, c: _Cycle, verdicts: list[cycle.Verdict | None],
              ) -> list[tuple[int, int, list[int]]]:
        """The cycle's one host synchronisation, for every row: (accepted n, extra token,
        drafted ids). Greedy rows (``verdicts[b]`` None, not in a group) are judged here on
        the host from the verify argmax, as ``sampling.accept_greedy`` does; a row whose
        compact acceptance tied at the top-k boundary is redone densely (only then a second
        sync)."""
        outs = [a for a in (c.target, c.grid) if a is not None]
        for g in c.groups:
            outs += list(g.verdict)
        for v, p in zip(verdicts, c.proposals):
            if v is not None:
                outs += [v.n, v.extra] + ([v.exact] if v.exact is not None else []) + \
                    ([p.tokens] if p is not None and c.grid is None else [])
        mx.eval(outs)
        target = c.target.tolist() if c.target is not None else None
        grid = c.grid.tolist() if c.grid is not None else None
        grouped = {b: (g, i, *(a.tolist() for a in g.verdict))
                   for g in c.groups for i, b in enumerate(g.rows)}
        results = []
        for b, (v, p, k) in enumerate(zip(verdicts, c.proposals, c.ks)):
            drafted = grid[b][:k] if grid is not None else [] if p is None else p.tokens.tolist()
            if b in grouped:
                g, i, ns, extras, exact = grouped[b]
                if exact[i]:
                    results.append((ns[i], extras[i], drafted))
                    continue
                c.proposals[b] = Proposal(tokens=c.grid[b, :k], q=g.q(i))
                v = self._accept(b, c, key=g.keys[i], dense=True)
            elif v is None:
                n = next((i for i, d in enumerate(drafted) if d != target[b][i]), k)
                results.append((n, target[b][n], drafted))
                continue
            elif v.exact is not None and not v.exact.item():
                v = self._accept(b, c, key=v.key, dense=True)
            results.append((int(v.n.item()), int(v.extra.item()), drafted))
        return results
