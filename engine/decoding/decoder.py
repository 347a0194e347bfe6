"""``BatchDecoder``: the one decoder. Every reply is a row of a batch — alone (``generate``, a
batch of one) or with up to ``max_streams`` others, each with its own prompt, sampling, seed,
stop strings, depth (fixed or auto), drafter, draft mode, grammar, budget and cancel flag.

Each ``step()`` is ``admit_step()`` (again while the prompt next in line fits what is left of
``PREFILL_BUDGET`` tokens: ``parts()``) then ``cycle_step()``:

1. admission (``admission``): cancelled streams end (their state goes to the prompt cache);
   one prefill chunk of the stream at the head of the line; a stream whose prompt is done
   draws its first token and joins the batch (``engine.decoding.batch_caches.Batch.join``);
2. one cycle over every joined row: the plain pipeline (``plain``) when every row decodes at
   depth 0 (fixed, or ``auto`` with its controller at depth 0) with its tokens drawn on the
   device, else the speculative cycle (``speculative``:
   propose → verify → accept → one host sync); then, the same for both, the rows' tokens are
   cut (``output.cut``), committed (``Batch.commit``: each row keeps its own accepted length)
   and emitted (``output.events``); finished rows leave, their state kept
   (``core.carryover.Carryover.keep``).

Exactness per stream: a row's drafts and acceptance use the same functions, the same keys in
the same order and the same logits (up to float rounding of the batched matmuls) as it would
alone — the first token takes the first key, a draft of k tokens the next key split k ways,
acceptance the next; a depth-0 row one key per token. So a seeded stream gives the same tokens
batched or alone, and greedy streams equal plain decoding.
"""
from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator

import mlx.core as mx

from engine.core.threadexit import note_mlx_thread
from engine.decoding import draw, output, plain, speculative
from engine.decoding.admission import Admission
from engine.decoding.batch_caches import Batch
from engine.decoding.checks import check_prompt, check_request
from engine.decoding.drafters import Drafter
from engine.decoding.plan import Cycle, RowResult
from engine.decoding.reply import Reply
from engine.decoding.session import PREFILL_CHUNK
from engine.decoding.stream import RECENT, Row, Stream, new_id
from engine.errors import GenerationError
from engine.sampling.grammar import Constraint
from engine.types import Depth, DraftMode, Event, SamplingParams

DEFAULT_STREAMS = 8
PREFILL_BUDGET = PREFILL_CHUNK  # prompt tokens one step prefills, over every stream it admits

Emitted = list[tuple[Stream, Event]]


class BatchDecoder:
    """See the module docstring. Not thread-safe: one thread calls ``add`` and ``step``.
    ``carryover``: the prompt cache, disk cache and depth controllers it reads and writes
    (``engine.core.carryover``; default: the model's shared one). ``use_mtp=False``: streams
    draft with their own ``drafter`` (or decode at depth 0). ``profile``: synchronise after
    every phase, so each phase's time is its true cost. ``share``: on a rank of a cluster,
    what makes every rank decide alike (``engine.distributed.lockstep.Decisions``: rank 0's
    first tokens, drafts and accepted lengths on every rank); None alone."""

    def __init__(self, model, *, carryover=None, max_streams: int = DEFAULT_STREAMS,
                 use_mtp: bool = True, profile: bool = False, share=None) -> None:
        if max_streams < 1:
            raise GenerationError(f"max_streams must be at least 1, not {max_streams}")
        note_mlx_thread()
        if carryover is None:
            from engine.core.carryover import carryover_of

            carryover = carryover_of(model)
        self.model = model
        self.carryover = carryover
        self.max_streams = max_streams
        self.profile = profile
        self.batch = Batch(model, use_mtp=use_mtp, counts=carryover.token_counts)
        self.admission = Admission(model, carryover, use_mtp=self.batch.use_mtp, share=share)
        self.share = share
        self.plain = plain.PlainPipeline(self.batch)
        self.active: list[Stream] = []   # the batch's rows, in row order
        self.cycles = 0
        self._drafter_controller = None  # auto rows' controller when drafting without the head
        self._chosen: tuple[int, str] | None = None  # the next cycle's auto depth, chosen ahead
        # finished streams' states, kept (prompt cache, disk cache) at the next step: after
        # the caller has handed out their last events
        self._to_keep: list[tuple] = []

    @property
    def busy(self) -> bool:
        """Streams to run, or finished streams' states still to keep (one more step)."""
        return bool(len(self.admission) or self.active or self._to_keep)

    @property
    def room(self) -> int:
        """How many more streams ``add`` takes before ``max_streams`` are in."""
        return max(0, self.max_streams - len(self.admission) - len(self.active))

    @property
    def waiting(self):
        return self.admission.waiting

    # -- adding streams ---------------------------------------------------------------------
    def add(self, prompt_ids, *, max_tokens: int = 256, depth: Depth = "auto",
            sampling: SamplingParams | None = None, seed: int | None = None,
            cancel: threading.Event | None = None, stop_strings: tuple[str, ...] = (),
            drafter: Drafter | None = None, draft_mode: DraftMode = "filtered",
            constraint: Constraint | None = None, id: str | None = None) -> Stream:
        """Queue a stream (checked like ``Model.generate``, raising ``GenerationError``)."""
        params = SamplingParams() if sampling is None else sampling
        model = self.model
        images = getattr(prompt_ids, "images", ())
        prompt = check_prompt(model, prompt_ids)
        if images:
            from engine.vision.prompt import check_images

            images = check_images(model, prompt, images)
        budget = check_request(model, prompt, max_tokens=max_tokens, depth=depth,
                               sampling=params, stop_strings=stop_strings, drafter=drafter,
                               draft_mode=draft_mode)
        if drafter is not None and self.batch.use_mtp:
            raise GenerationError("a batch drafts with the MTP head or with each stream's own "
                                  "drafter, not both: make it with use_mtp=False")
        if depth != 0 and drafter is None and not self.batch.use_mtp:
            raise GenerationError("this batch has no MTP head to draft with: use depth 0")
        reply = Reply(tokenizer=model.tokenizer, eos=model.info.eos_token_ids, budget=budget,
                      stop_strings=tuple(stop_strings), vocab_size=model.info.vocab_size,
                      penalties=params.presence_penalty != 0 or params.frequency_penalty != 0,
                      cancel=cancel)
        row = Row(reply=reply, params=params, keys=draw.keys(seed), drafter=drafter,
                  constraint=constraint, draft_mode=draft_mode,
                  prompt_tail=tuple(prompt[-RECENT:]))
        st = Stream(id=id or new_id(), prompt=prompt, row=row, depth=depth, images=images)
        if depth == "auto" and drafter is None and not self.busy:  # a new prompt, alone
            self.carryover.controller(model, 1).new_request(
                continues=self.carryover.continues(prompt))
        self.admission.waiting.append(st)
        return st

    # -- one step -------------------------------------------------------------------------------
    def step(self) -> Emitted:
        """The step's ``parts()``; returns their events, in order."""
        return [e for part in self.parts() for e in part()]

    def parts(self) -> Iterator[Callable[[], Emitted]]:
        """One step, as the calls a caller makes in turn (handing out each one's events
        before the next): ``admit_step``, again while the prompt next in line fits in what is
        left of ``PREFILL_BUDGET`` prompt tokens this step (short prompts that arrive together
        join the batch together, not one cycle apart each: the others' next tokens wait at most
        as long as for one full chunk), then ``cycle_step``."""
        budget = PREFILL_BUDGET
        while True:
            fed = self.admission.fed
            yield functools.partial(self.admit_step, budget=budget)
            if self.admission.fed == fed:  # nothing prefilled (none waited, or all cached)
                break
            budget -= self.admission.fed - fed
            if not self.admission.fits(budget, room=len(self.active) < self.max_streams):
                break
        yield self.cycle_step

    def run(self) -> Iterator[tuple[Stream, Event]]:
        """``step()`` until every stream has finished."""
        while self.busy:
            yield from self.step()

    def admit_step(self, budget: int = PREFILL_BUDGET) -> Emitted:
        """End cancelled streams and run one prefill chunk (if a stream waits and a row is
        free), or prefill the short prompts at the head of the line together (within
        ``budget`` prompt tokens: ``admission``): a stream whose prompt is done gets its first
        token here and joins the batch.
        (Callers that deliver events hand these out before the cycle: a joining stream's time
        to first token is its prefill chunk, not the cycle after it.) First the states of the
        streams that finished since the last step go to the prompt cache, before a prompt
        looks there."""
        self._note_busy()
        self._keep_finished()
        out = [self._end(st, st.reply.cancel_event()) for st in self.admission.cancelled()]
        gone = [b for b, st in enumerate(self.active) if st.reply.cancelled]
        out += [self._end(self.active[b], self.active[b].reply.cancel_event(), row=b)
                for b in gone]
        self._leave(gone)
        for st in self.admission.step(self.max_streams - len(self.active), budget,
                                      len(self.active)):
            out.append(self._join(st))
        return out

    def cycle_step(self) -> Emitted:
        """One batched cycle over the joined rows (none: nothing)."""
        out = self._cycle() if self.active else []
        self._note_busy()
        return out

    def _note_busy(self) -> None:
        """Tell the disk cache whether a decode or prefill runs or waits: it writes its queued
        snapshots only while none does."""
        disk = self.carryover.disk_cache
        if disk is not None:
            disk.note_busy(bool(self.active or self.admission.waiting
                                or self.admission.joining is not None))

    def close(self) -> Emitted:
        """End every stream now (cancelled), each one's state kept for its next turn."""
        out = [self._end(st, st.reply.cancel_event())
               for st in list(self.admission.waiting) + [self.admission.joining] if st]
        self.admission.waiting.clear()
        self.admission.joining = None
        out += [self._end(st, st.reply.cancel_event(), row=b)
                for b, st in enumerate(self.active)]
        self._leave(list(range(len(self.active))))
        self._keep_finished()
        return out

    # -- streams joining and leaving -----------------------------------------------------------
    def _join(self, st: Stream) -> tuple[Stream, Event]:
        ev = self.admission.first_token(st)
        if ev.finish_reason is not None:
            return self._end(st, ev)
        self.plain.settle(self.active)
        self._chosen = None  # the batch grows: its size's controller chooses
        self.batch.join(st.session, track=st.depth != 0)
        st.session = st.prefill = None
        self.active.append(st)
        # conversations decoded concurrently each keep their own prompt-cache state (a lone
        # chat keeps one)
        pc = self.carryover.prompt_cache
        pc.max_lineages = max(pc.max_lineages, len(self.active))
        return st, ev

    def _end(self, st: Stream, ev: Event, *, row: int | None = None) -> tuple[Stream, Event]:
        """``st`` is done with ``ev``; its final state goes to the prompt cache at the next
        step (``_keep_finished``): keeping it (the disk cache's copies: 60-150 ms at 5-10k
        tokens) held back the reply's last tokens. The disk cache then writes them while
        nothing decodes (``_note_busy``)."""
        st.finished = True
        if self.batch.draft_vocab is not None:  # the tokens that rank its set next time
            self.carryover.observe(st.reply.generated)
        self.plain.carry.pop(st.id, None)
        ahead = None if self.plain.ahead is None else self.plain.ahead.mark  # before it
        session = st.session if row is None else self.batch.extract(row, ahead)
        if row is not None:  # the same conversation: its snapshots replace each other
            session.lineage = st.lineage
        if session is not None and st.after_prompt is not None:
            self._to_keep.append((st.after_prompt, session.snapshot(), st.checkpoint))
        st.session = st.prefill = None
        return st, ev

    def _keep_finished(self) -> None:
        kept, self._to_keep = self._to_keep, []
        for after_prompt, at_end, checkpoint in kept:
            self.carryover.keep(after_prompt, at_end, checkpoint)

    def _leave(self, rows: list[int]) -> None:
        """Remove ``rows``; a queued plain step goes on for the others."""
        if rows:
            self.batch.leave(rows)
            keep = [b for b in range(len(self.active)) if b not in set(rows)]
            self.active = [self.active[b] for b in keep]
            self.plain.leave(keep)

    # -- the cycle -------------------------------------------------------------------------------
    def _cycle(self) -> Emitted:
        streams = self.active
        ctrl = self._controller(len(streams)) if any(st.depth == "auto" for st in streams) \
            else None
        chosen, self._chosen = self._chosen, None  # the auto rows' depth, chosen ahead
        # a cluster shares each token: never pipelined
        plainly = self.share is None and plain.pipelined(streams, auto=True)
        if plainly and ctrl is not None:
            chosen = chosen or ctrl.choose()
            plainly = chosen[0] == 0
        if plainly:
            joining = bool(self.admission.waiting) and len(streams) < self.max_streams \
                or self.admission.joining is not None
            c, results, times = self.plain.cycle(
                streams, joining=joining, ahead=None if ctrl is None else self._ahead(ctrl))
            if ctrl is not None:  # it learns from this cycle as from a speculative one
                c.controller = ctrl
                c.reasons = [chosen[1] if st.depth == "auto" else r
                             for st, r in zip(streams, c.reasons)]
        else:
            self.plain.settle(streams)
            c, results, times = speculative.run(self.batch, streams, ctrl, self.plain.key_for,
                                                profile=self.profile, share=self.share,
                                                chosen=chosen)
        return self._finish_cycle(c, results, times)

    def _ahead(self, ctrl) -> Callable[[], bool]:
        """For the plain pipeline with auto rows: whether to queue the next cycle's step now,
        which takes choosing its depth now (kept for that cycle) — depth 0, or a queued step
        would be rewound. Not while the controller warms up: its schedule counts the cycles
        it has seen, and this one it has not seen yet."""
        def ahead() -> bool:
            if ctrl.warming_up:
                return False
            self._chosen = ctrl.choose()
            return self._chosen[0] == 0
        return ahead

    def _controller(self, rows: int):
        """The auto rows' depth controller: the carryover's for this batch size when the MTP
        head drafts; one of this decoder's own (made once) for passed-in drafters, so a
        replay's acceptance never teaches the head's controller."""
        if self.batch.use_mtp:
            return self.carryover.controller(self.model, rows)
        if self._drafter_controller is None:
            self._drafter_controller = self.carryover.controller(self.model, rows, drafter=True)
        return self._drafter_controller

    def _finish_cycle(self, c: Cycle, results: list[RowResult], times: dict) -> Emitted:
        """Cut, commit and emit (the same for a plain and a speculative cycle)."""
        t_read = time.perf_counter()
        streams = self.active
        cuts, keeps = output.cut(streams, results)
        c.inputs = [[st.x0] + r.drafted for st, r in zip(streams, results)]
        self.batch.commit(c.inputs, keeps, c.ver,
                          drafted=self.batch.use_mtp and max(c.ks) > 0)
        if self.profile:
            mx.eval([a for a in self.batch.trunk_state() if a is not None])
        now = time.perf_counter()
        self.plain.t_last = now
        self.cycles += 1
        times.update(t_commit=now - t_read, t_total=now - c.t0)
        evs = output.events(c, streams, results, cuts, times,
                            [len(f) for f in self.batch.fed],
                            host_syncs=4 if self.profile else 1)
        out, done = [], []
        for b, (st, ev) in enumerate(zip(streams, evs)):
            if ev.finish_reason is not None:
                out.append(self._end(st, ev, row=b))
                done.append(b)
            else:
                out.append((st, ev))
        self._leave(done)
        return out


def generate(model, prompt_ids, *, carryover=None, max_tokens: int, depth: Depth,
             sampling: SamplingParams, seed: int | None, cancel: threading.Event | None,
             stop_strings: tuple[str, ...], drafter: Drafter | None = None,
             draft_mode: DraftMode = "filtered", profile: bool = False,
             constraint: Constraint | None = None) -> Iterator[Event]:
    """One reply as a batch of one: every argument is checked now (raising
    ``GenerationError``), then the event stream is returned. Closing it early ends the reply
    with its state kept for the next turn."""
    dec = BatchDecoder(model, carryover=carryover, max_streams=1, profile=profile,
                       use_mtp=drafter is None and depth != 0)
    dec.add(prompt_ids, max_tokens=max_tokens, depth=depth, sampling=sampling, seed=seed,
            cancel=cancel, stop_strings=stop_strings, drafter=drafter, draft_mode=draft_mode,
            constraint=constraint)
    return _events(dec)


def _events(dec: BatchDecoder) -> Iterator[Event]:
    try:
        while dec.busy:
            for _, ev in dec.step():
                yield ev
    finally:
        if dec.busy:  # the consumer closed the reply early: keep its state whole
            dec.close()
