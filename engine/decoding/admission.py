"""Admission: which stream prefills this step, and its first token.

Streams wait in arrival order. While a row is free, the stream at the head of the line is
resumed from the carryover's longest snapshot (``core.carryover.Carryover.session_for``) and
prefilled one chunk per admission (``Session.prefill_chunks``), so a long new prompt stalls the
batch's other rows for one chunk at a time (a step admits again while the next short prompt
fits the same budget: ``BatchDecoder.parts``). When its prompt is done it draws its first token
(its first key) and is ready to join the batch as a row.

Short new prompts at the head of the line that fit one step's budget together (and free rows)
prefill in one forward instead (``engine.decoding.together``): a burst of requests pays one
prefill's fixed cost, not one each.
"""
from __future__ import annotations

import time
from collections import deque

from engine.decoding import draw, together
from engine.decoding.stream import Stream
from engine.types import Event, PrefillStats


class Admission:
    """The waiting line and the stream being prefilled (``joining``)."""

    def __init__(self, model, carryover, *, use_mtp: bool, share=None) -> None:
        self.model = model
        self.share = share  # a cluster's: rank 0's first token on every rank
        self.carryover = carryover
        self.use_mtp = use_mtp
        self.waiting: deque[Stream] = deque()
        self.joining: Stream | None = None
        self.fed = 0  # prompt tokens prefilled so far (``fits`` budgets a step by them)

    def __len__(self) -> int:
        return len(self.waiting) + (self.joining is not None)

    def cancelled(self) -> list[Stream]:
        """Take the waiting or prefilling streams whose cancel flag is set."""
        out = [s for s in self.waiting if s.reply.cancelled]
        for st in out:
            self.waiting.remove(st)
        if self.joining is not None and self.joining.reply.cancelled:
            out.append(self.joining)
            self.joining = None
        return out

    def step(self, free: int, budget: int | None = None, active: int = 0) -> list[Stream]:
        """One prefill chunk (when a stream is prefilling, or one waits and a row is
        ``free``), or the prompts prefilled together (``together``: with at least two rows
        free and ``budget`` prompt tokens for them); returns the streams whose prompts are now
        done. ``active``: the rows decoding meanwhile (each a conversation whose state the
        prompt cache keeps, ``_in_flight``)."""
        if self.joining is None:
            if not self.waiting or free < 1:
                return []
            group = self._together(free, budget, active)
            if group:
                return group
            self.joining = st = self.waiting.popleft()
            self._in_flight(active + 1)
            st.session, st.reused = self.carryover.session_for(self.model, st.prompt,
                                                               self.use_mtp, st.media)
            st.prefill = self._prefill(st)
        st = self.joining
        before = len(st.session.fed)
        more = next(st.prefill, None) is not None and len(st.session.fed) < len(st.prompt)
        self.fed += len(st.session.fed) - before
        if more:
            return []  # more chunks to go: the batch runs a cycle meanwhile
        self.joining = None
        return [st]

    def _in_flight(self, conversations: int) -> None:
        """Before a prompt takes its state from the prompt cache: ``conversations`` are
        decoded concurrently, so the cache keeps that many (one each, ``PromptCache``). A lone
        chat keeps one; in a burst, the second request's ``take`` no longer drops the first's
        checkpoint (its next turn was prefilled anew)."""
        pc = self.carryover.prompt_cache
        pc.max_lineages = max(pc.max_lineages, conversations)

    def _together(self, free: int, budget: int | None, active: int = 0) -> list[Stream]:
        """The streams at the head of the line, prefilled in one forward, when at least
        ``together.MIN_ROWS`` qualify: at most ``free`` of them and ``budget`` prompt tokens in
        all, text only, nothing of theirs in the prompt cache (in memory, or on disk for
        prompts that long), and the chat template's checkpoint the same distance from the end
        of each (one index of the padded forward). Else none: the head prefills alone."""
        if self.share is not None or budget is None or free < together.MIN_ROWS:
            return []
        disk = self.carryover.disk_cache
        group, total, back = [], 0, None
        for st in self.waiting:
            n = len(st.prompt)
            if len(group) == free or total + n > budget or st.images or st.reply.cancelled:
                break
            if disk is not None and n >= disk.min_tokens:
                break
            if self.carryover.prompt_cache.holds(st.prompt, need_mtp=self.use_mtp,
                                                 media=st.media):
                break
            cut = self.carryover.checkpoint(self.model, st.prompt)
            b = None if cut is None else n - cut
            if group and b != back:
                break
            group.append(st)
            total, back = total + n, b
        if len(group) < together.MIN_ROWS or \
                not together.supported(self.model, max(len(st.prompt) for st in group)):
            return []
        self._in_flight(active + len(group))
        for st in group:
            self.waiting.popleft()
            st.session, st.reused = self.carryover.session_for(self.model, st.prompt,
                                                               self.use_mtp, st.media)
        together.prefill(self.model, [st.session for st in group],
                         [st.prompt for st in group], back)
        for st in group:
            if back is not None:
                st.checkpoint = st.session.marked
                self.carryover.prompt_cache.keep(st.checkpoint)
            self.fed += len(st.prompt)
        return group

    def fits(self, budget: int, *, room: bool) -> bool:
        """Whether the stream next in line would start and finish its prefill within
        ``budget`` prompt tokens (its whole prompt counted: what the prompt cache holds is
        known once it starts), with ``room`` for it in the batch and none prefilling."""
        return (room and self.joining is None and bool(self.waiting)
                and len(self.waiting[0].prompt) <= budget)

    def _prefill(self, st: Stream):
        """The prompt's chunks, one admission step each; at the carryover's checkpoint
        (before the chat template's generation prompt) the state goes to the prompt cache,
        for the next turn. The generation prompt (a few tokens) runs in the same step as the
        chunk before it, so the checkpoint costs no step of its own."""
        cut = self.carryover.checkpoint(self.model, st.prompt)
        if cut is None or st.reused >= cut:
            if st.reused < len(st.prompt):
                yield from st.session.prefill_chunks(st.prompt[st.reused:], st.images)
            return
        if self.share is None and not st.images:
            # one forward over the chunk that holds the checkpoint where the model can give
            # the state inside it (else two, in one step: ``Session.prefill_chunks``)
            for fed in st.session.prefill_chunks(st.prompt[st.reused:], mark=cut - st.reused):
                if st.checkpoint is None and st.session.marked is not None:
                    st.checkpoint = st.session.marked
                    self.carryover.prompt_cache.keep(st.checkpoint)
                yield fed
            return
        chunks = st.session.prefill_chunks(st.prompt[st.reused:cut], st.images)
        fed = next(chunks)
        for later in chunks:  # every chunk but the last gets its own step
            yield fed
            fed = later
        # On a cluster every rank must evaluate the same collectives in the same order. A
        # pipeline rank's next forward does not depend on this one's send to the next rank,
        # so with both forwards queued lazily that send is never run and the next rank waits
        # for it forever: evaluate the prefix here, as every chunk but the last.
        if self.share is not None:
            st.session.settle()
        st.checkpoint = st.session.snapshot()
        self.carryover.prompt_cache.keep(st.checkpoint)
        for fed in st.session.prefill_chunks(st.prompt[cut:], st.images):
            pass
        yield fed

    def first_token(self, st: Stream) -> Event:
        """The prompt's next token, drawn as plain decoding draws it (the stream's first
        key); the state after the prompt goes to the prompt cache."""
        s, row, reply = st.session, st.row, st.reply
        x0 = draw.draw(s.last_logits, row.params, reply.counts, next(row.keys),
                       row.constraint)
        if self.share is not None:
            x0 = self.share.first_token(x0)
        st.after_prompt = s.snapshot()
        self.carryover.prompt_cache.keep(st.after_prompt)
        prefill = PrefillStats(prompt_tokens=len(st.prompt), reused_tokens=st.reused,
                               seconds=time.perf_counter() - st.submitted)
        ev = reply.emit(*draw.cut(reply, [x0], row.constraint), prefill=prefill)
        st.x0, st.lineage = x0, s.lineage
        return ev
