"""``Model.generate``: plain decoding (depth 0) and MTP speculative decoding (depth k / auto).

One speculative cycle (ARCHITECTURE.md): the MTP head drafts d1..dk from the pending token x0;
ONE trunk forward verifies [x0, d1..dk] while capturing every Gated DeltaNet state; exact
acceptance keeps n drafts plus a correction or bonus token; the commit trims attention KV,
selects the captured GDN state at step n and queues the accepted MTP pairs. The cycle is built
lazily and synchronised once. Depth never depends on the future, so output is exact.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import mlx.core as mx

from engine import sampling
from engine.detok import StreamingText
from engine.errors import GenerationError, PromptTooLongError
from engine.session import Session, Snapshot
from engine.types import CycleStats, Event, PrefillStats, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class PromptCache:
    """Snapshots of a conversation's decode state (after the prompt, after the reply)."""

    snapshots: list[Snapshot] = field(default_factory=list)

    def take(self, prompt: list[int]) -> Snapshot | None:
        best = None
        for s in self.snapshots:
            n = len(s.fed)
            if n <= len(prompt) and tuple(prompt[:n]) == s.fed and n > 0:
                if n == len(prompt) and s.last_logits is None:
                    continue
                if best is None or n > len(best.fed):
                    best = s
        # Snapshots share attention buffers: once one is resumed the others are stale.
        self.snapshots = []
        return best


def _check(model, prompt_ids: list[int], max_tokens: int, depth, drafter) -> int:
    if not prompt_ids:
        raise GenerationError("The prompt is empty.")
    ctx = model.info.context_length
    if len(prompt_ids) >= ctx:
        raise PromptTooLongError(
            f"The prompt has {len(prompt_ids)} tokens but the model's context is {ctx}. "
            "Shorten the conversation or start a new chat.")
    if depth != "auto" and not (isinstance(depth, int) and 0 <= depth <= 6):
        raise GenerationError(f"depth must be 0..6 or 'auto', not {depth!r}.")
    if depth != 0 and drafter is None and model.mtp is None:
        raise GenerationError(
            "This model has no MTP head, so it cannot speculate: use depth 0. "
            "(Converters such as mlx_lm.convert drop mtp.* tensors; convert from the official "
            "Qwen repo with `python -m engine pull REPO --convert` to keep them.)")
    if max_tokens < 1:
        raise GenerationError("max_tokens must be at least 1.")
    return min(max_tokens, ctx - len(prompt_ids))


def _session_for(model, prompt: list[int], use_mtp: bool) -> tuple[Session, int]:
    if model.prompt_cache is None:
        model.prompt_cache = PromptCache()
    snap = model.prompt_cache.take(prompt)
    if snap is not None and (not use_mtp or snap.mtp_ok):
        return Session.from_snapshot(model, snap, use_mtp=use_mtp), len(snap.fed)
    return Session.fresh(model, use_mtp=use_mtp), 0


def _pick(logits: mx.array, params: SamplingParams, counts, key) -> mx.array:
    """The next token from logits [1, V] exactly as plain decoding samples it."""
    c = None if counts is None else counts[None]
    if params.greedy:
        return sampling.argmax_tokens(logits, params, c)[0]
    return sampling.sample(sampling.build_probs(logits, params, c), key)[0]


def generate(model, prompt_ids: list[int], *, max_tokens: int, depth, sampling: SamplingParams,
             seed: int | None, cancel: threading.Event | None, stop_strings: tuple[str, ...],
             drafter=None, profile: bool = False) -> Iterator[Event]:
    params = sampling
    budget = _check(model, prompt_ids, max_tokens, depth, drafter)
    use_mtp = model.mtp is not None and drafter is None and depth != 0
    t_start = time.perf_counter()
    session, reused = _session_for(model, prompt_ids, use_mtp)
    if reused < len(prompt_ids):
        session.prefill(prompt_ids[reused:])
    key = _keys(seed)
    penalties = params.presence_penalty != 0 or params.frequency_penalty != 0
    counts = mx.zeros((model.info.vocab_size,), dtype=mx.float32) if penalties else None
    x0 = int(_pick(session.last_logits, params, counts, next(key)).item())
    model.prompt_cache.snapshots.append(session.snapshot())
    prefill = PrefillStats(prompt_tokens=len(prompt_ids), reused_tokens=reused,
                           seconds=time.perf_counter() - t_start)
    eos = set(model.info.eos_token_ids)
    stream = StreamingText(model.tokenizer, stop_strings, skip_ids=eos)
    state = _Loop(model=model, session=session, params=params, key=key, counts=counts,
                  stream=stream, eos=eos, budget=budget, cancel=cancel, profile=profile)
    first = state.emit_first(x0, prefill)
    yield first
    if first.finish_reason is None:
        if depth == 0 and drafter is None:
            yield from state.run_plain(x0)
        else:
            yield from state.run_speculative(x0, depth, drafter)
    model.prompt_cache.snapshots.append(session.snapshot())


def _controller(model, drafter):
    """One adaptive controller per model (or drafter), seeded from a saved tuning, so a new
    reply does not pay the warm-up again."""
    from engine.adaptive import controller_for

    initial = None
    try:
        from engine import store

        initial = (store.read_tuned(model.info.path) or {}).get("adaptive_initial")
    except Exception:  # noqa: BLE001 - a missing/corrupt tuning file only costs warm-up
        log.debug("no saved tuning for %s", model.info.path, exc_info=True)
    max_d = 4 if drafter is not None else min(model.info.max_depth or 3, 4)
    return controller_for(model if drafter is None else drafter, max_d, initial=initial)


def _keys(seed: int | None):
    k = sampling.make_key(seed if seed is not None else random.getrandbits(62))
    while True:
        k, sub = sampling.split_key(k, 2)
        yield sub


@dataclass
class _Loop:
    model: object
    session: Session
    params: SamplingParams
    key: Iterator
    counts: mx.array | None
    stream: StreamingText
    eos: set[int]
    budget: int
    cancel: threading.Event | None
    profile: bool
    generated: list[int] = field(default_factory=list)
    cycle: int = 0

    def _finish_for(self, tokens: list[int]) -> tuple[list[int], str | None]:
        for i, t in enumerate(tokens):
            if t in self.eos:
                return tokens[:i + 1], "stop"
        if len(self.generated) + len(tokens) >= self.budget:
            return tokens[: self.budget - len(self.generated)], "length"
        return tokens, None

    def _text(self, tokens: list[int], reason: str | None) -> tuple[str, str | None]:
        text = self.stream.add(tokens)
        if self.stream.stopped:
            return text, "stop"
        if reason is not None:
            text += self.stream.flush()
        return text, reason

    def _count(self, tokens: list[int]) -> None:
        if self.counts is not None and tokens:
            self.counts = sampling.add_counts(self.counts, mx.array(tokens, dtype=mx.int32))

    def emit_first(self, x0: int, prefill: PrefillStats) -> Event:
        tokens, reason = self._finish_for([x0])
        self.generated.extend(tokens)
        self._count(tokens)
        text, reason = self._text(tokens, reason)
        return Event(token_ids=tuple(tokens), text=text, prefill=prefill, finish_reason=reason)

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def _cancel_event(self) -> Event:
        return Event(token_ids=(), text=self.stream.flush(), finish_reason="cancelled")

    def run_plain(self, x0: int) -> Iterator[Event]:
        """Depth 0, pipelined like mlx-lm: the next step is queued before reading this one."""
        s = self.session
        s.mtp_ok = False  # plain steps keep no hiddens for the MTP cache
        y = _pick(s.step_plain(mx.array([x0])), self.params, self.counts, next(self.key))
        mx.async_eval(y)
        s.fed.append(x0)
        t_prev = time.perf_counter()
        while True:
            if self._cancelled():
                yield self._cancel_event()
                return
            counts = self.counts
            if counts is not None:
                counts = sampling.add_counts(counts, y[None])
            nxt = _pick(s.step_plain(y), self.params, counts, next(self.key))
            mx.async_eval(nxt)
            tok = int(y.item())
            s.fed.append(tok)
            self.counts = counts
            tokens, reason = self._finish_for([tok])
            self.generated.extend(tokens)
            text, reason = self._text(tokens, reason)
            now = time.perf_counter()
            self.cycle += 1
            stats = CycleStats(index=self.cycle, depth=0, drafted=(), accepted=0,
                               emitted=tuple(tokens), from_draft=(False,) * len(tokens),
                               extra_kind="plain", t_verify=now - t_prev, t_total=now - t_prev,
                               context_tokens=len(s.fed), host_syncs=1)
            t_prev = now
            yield Event(token_ids=tuple(tokens), text=text, stats=stats, finish_reason=reason)
            if reason is not None:
                mx.eval(nxt)
                return
            y = nxt

    def run_speculative(self, x0: int, depth, drafter) -> Iterator[Event]:
        """Cycles overlap with the consumer: the next cycle's draft is launched before the
        current event is handed out; a cancel in between undoes that draft."""
        from engine.spec import abandon, complete, launch

        controller = _controller(self.model, drafter) if depth == "auto" else None

        def next_launch(x: int):
            k, reason = controller.choose() if controller else (depth, "fixed")
            k = max(0, min(int(k), self.budget - len(self.generated) - 1))
            return launch(self, x, k, reason, drafter)

        if self._cancelled():
            yield self._cancel_event()
            return
        lc = next_launch(x0)
        while True:
            if lc is None or self._cancelled():
                if lc is not None:
                    abandon(self, lc)
                yield self._cancel_event()
                return
            ev, x0 = complete(self, lc)
            if controller is not None:
                controller.observe(ev.stats)
            if ev.finish_reason is not None:
                yield ev
                return
            lc = None if self._cancelled() else next_launch(x0)
            yield ev
