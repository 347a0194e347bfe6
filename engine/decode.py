"""``Model.generate``: plain decoding (depth 0) and MTP speculative decoding (depth k / auto).

Request → checks (every argument, before anything reaches MLX) → a ``Session`` resumed from
the prompt cache (in memory, then on disk: ``engine.diskcache``) or freshly prefilled → the first token → decode loop → events. The reply
(``engine.reply.Reply``) finishes and emits for both loops; the speculative loop runs the
cycle functions of ``engine.cycle`` (draft → verify → accept → commit). Depth never depends on
the future, so output is exact at every depth.

Pipelining: at depth 0 the next step is queued before the current one is read (as mlx-lm
does); speculatively, the next cycle's draft is launched before the current event is handed
out. A launched draft that will not be verified (cancel, or the consumer closing the
generator) is undone in a ``finally:``, so the state kept for the next turn is intact.
"""
from __future__ import annotations

import functools
import logging
import numbers
import random
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import mlx.core as mx

from engine import candidates, cycle, grammar, sampling, store
from engine.adaptive import AdaptiveDepth, carry_over
from engine.drafters import Drafter, MTPDrafter
from engine.errors import GenerationError, PromptTooLongError
from engine.grammar import Constraint
from engine.reply import Reply
from engine.session import Session
from engine.types import (
    DRAFT_MODES,
    MAX_DEPTH,
    CycleStats,
    DraftMode,
    Event,
    PrefillStats,
    SamplingParams,
)

log = logging.getLogger(__name__)

AUTO_MAX_DEPTH = 4  # the deepest draft ``depth="auto"`` considers


def check_prompt(model, prompt_ids) -> list[int]:
    """The prompt as a list of ints in ``0 <= id < vocab_size``, or a GenerationError."""
    if isinstance(prompt_ids, (str, bytes)):
        raise GenerationError("prompt_ids must be a sequence of token ids, not a string.")
    ids = list(prompt_ids)
    if not ids:
        raise GenerationError("The prompt is empty.")
    vocab = model.info.vocab_size
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise GenerationError(f"prompt_ids[{i}] is not an integer token id: {t!r}")
        if not 0 <= t < vocab:
            raise GenerationError(
                f"prompt_ids[{i}] = {t} is out of range: token ids go from 0 to {vocab - 1}.")
    return [int(t) for t in ids]


def check_request(model, prompt: list[int], *, max_tokens, depth, sampling, stop_strings,
                  drafter, draft_mode) -> int:
    """Validate the arguments of ``generate``; returns the token budget."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral):
        raise GenerationError(f"max_tokens must be an integer, not {max_tokens!r}")
    if max_tokens < 1:
        raise GenerationError(f"max_tokens must be at least 1, not {max_tokens}")
    if not isinstance(sampling, SamplingParams):
        raise GenerationError(f"sampling must be a SamplingParams, not {type(sampling).__name__}")
    if isinstance(stop_strings, str) or not all(isinstance(s, str) for s in stop_strings):
        raise GenerationError("stop_strings must be a list of strings (e.g. [\"\\n\\n\"]), "
                              f"not {stop_strings!r}")
    if draft_mode not in DRAFT_MODES:
        raise GenerationError(f"draft_mode must be one of {', '.join(DRAFT_MODES)}, "
                              f"not {draft_mode!r}")
    if depth != "auto" and (isinstance(depth, bool) or not isinstance(depth, int)
                            or not 0 <= depth <= MAX_DEPTH):
        raise GenerationError(f"depth must be 0..{MAX_DEPTH} or 'auto', not {depth!r}.")
    if depth != 0 and drafter is None and model.mtp is None:
        raise GenerationError(
            "This model has no MTP head, so it cannot speculate: use depth 0. "
            "(Converters such as mlx_lm.convert drop mtp.* tensors; convert from the official "
            "Qwen repo with `python -m engine pull REPO --convert` to keep them.)")
    ctx = model.info.context_length
    if len(prompt) >= ctx:
        raise PromptTooLongError(
            f"The prompt has {len(prompt)} tokens but the model's context is {ctx}. "
            "Shorten the conversation or start a new chat.")
    return min(int(max_tokens), ctx - len(prompt))


def generate(model, prompt_ids: Sequence[int], *, max_tokens: int, depth,
             sampling: SamplingParams, seed: int | None, cancel: threading.Event | None,
             stop_strings: tuple[str, ...], drafter: Drafter | None = None,
             draft_mode: DraftMode = "filtered", profile: bool = False,
             constraint: Constraint | None = None) -> Iterator[Event]:
    """Check every argument now (raising ``GenerationError``), then return the event stream.
    ``drafter`` replaces the MTP head (e.g. ``ReplayDrafter``); ``draft_mode`` is the MTP
    head's draft policy (``engine.drafters``); ``profile`` synchronises after every phase;
    ``constraint`` (``engine.grammar``, one per reply) masks every token drawn — the target
    rows and the drafts alike, so speculative output equals constrained plain decoding."""
    prompt = check_prompt(model, prompt_ids)
    budget = check_request(model, prompt, max_tokens=max_tokens, depth=depth,
                           sampling=sampling, stop_strings=stop_strings, drafter=drafter,
                           draft_mode=draft_mode)
    reply = Reply(tokenizer=model.tokenizer, eos=model.info.eos_token_ids, budget=budget,
                  stop_strings=tuple(stop_strings), vocab_size=model.info.vocab_size,
                  penalties=sampling.presence_penalty != 0 or sampling.frequency_penalty != 0,
                  cancel=cancel)
    return _stream(model, prompt, reply, depth=depth, params=sampling, seed=seed,
                   drafter=drafter, draft_mode=draft_mode, profile=profile,
                   constraint=constraint)


def _stream(model, prompt: list[int], reply: Reply, *, depth, params: SamplingParams,
            seed: int | None, drafter: Drafter | None, draft_mode: DraftMode,
            profile: bool, constraint: Constraint | None) -> Iterator[Event]:
    t_start = time.perf_counter()
    speculate = depth != 0 or drafter is not None
    session, reused = _session_for(model, prompt, model.mtp is not None and drafter is None
                                   and depth != 0)
    if reused < len(prompt):
        session.prefill(prompt[reused:])
    keys = _keys(seed)
    x0 = _draw(session.last_logits, params, reply.counts, next(keys), constraint)  # 1st token
    after_prompt = session.snapshot()
    model.prompt_cache.keep(after_prompt)
    prefill = PrefillStats(prompt_tokens=len(prompt), reused_tokens=reused,
                           seconds=time.perf_counter() - t_start)
    first = reply.emit(*_cut(reply, [x0], constraint), prefill=prefill)
    try:
        yield first
        if first.finish_reason is None and not speculate and constraint is not None:
            yield from run_plain_constrained(session, reply, params, keys, x0, constraint)
        elif first.finish_reason is None and not speculate:
            yield from run_plain(session, reply, params, keys, x0)
        elif first.finish_reason is None:
            row = cycle.Row(session=session, reply=reply, params=params, keys=keys,
                            drafter=drafter or MTPDrafter(session, mode=draft_mode),
                            constraint=constraint)
            controller = _controller(model, drafter) if depth == "auto" else None
            yield from run_speculative(row, x0, depth, controller, profile=profile)
    except GeneratorExit:  # the consumer closed the reply early: its state is still whole
        _keep(model, after_prompt, session.snapshot())
        raise
    _keep(model, after_prompt, session.snapshot())


def _keep(model, after_prompt, at_end) -> None:
    """Keep the reply's final state in memory; both snapshots go to the disk cache (if on),
    written in the background once the reply has ended."""
    model.prompt_cache.keep(at_end)
    disk = getattr(model, "disk_cache", None)
    if disk is not None:
        try:
            disk.save([after_prompt, at_end])
        except Exception:  # noqa: BLE001 - the disk cache never costs a reply
            log.warning("could not save the prompt cache", exc_info=True)


def _session_for(model, prompt: list[int], use_mtp: bool) -> tuple[Session, int]:
    """A session resumed from the longest usable snapshot: in memory first, then on disk
    (``engine.diskcache``, only for prompts it would have saved); else a fresh one."""
    snap = model.prompt_cache.take(prompt, need_mtp=use_mtp)
    disk = getattr(model, "disk_cache", None)
    if disk is not None and len(prompt) >= disk.min_tokens:
        snap = disk.load(prompt, longer_than=len(snap.fed) if snap else 0,
                         need_mtp=use_mtp) or snap
    if snap is not None:
        return Session.from_snapshot(model, snap, use_mtp=use_mtp), len(snap.fed)
    return Session.fresh(model, use_mtp=use_mtp), 0


def _pick(logits: mx.array, params: SamplingParams, counts, key, *,
          dense: bool = False) -> tuple[mx.array, mx.array | None]:
    """The next token from logits [1, V] exactly as plain decoding samples it, and, when the
    compact top-k sampler drew it, its ``exact`` flag [1] (False: redo with ``dense``)."""
    c = None if counts is None else counts[None]
    if params.greedy:
        return sampling.argmax_tokens(logits, params, c)[0], None
    compact = not dense and candidates.applies(params, logits.shape[-1], logits.dtype)
    draw = _compiled_draw(params, compact, c is not None)
    out = draw(logits, key) if c is None else draw(logits, key, c)
    return out[0], (out[1] if compact else None)


def _draw_ops(params: SamplingParams, compact: bool):
    """``_pick``'s non-greedy draw as MLX operations (logits, key, counts) -> (y[1], ...)."""
    if compact:
        def draw(logits, key, c):
            cand = candidates.build(logits, params, c)
            return candidates.sample(cand, key), cand.exact
        return draw
    return lambda logits, key, c: (sampling.sample(sampling.build_probs(logits, params, c),
                                                   key),)


@functools.lru_cache(maxsize=64)
def _compiled_draw(params: SamplingParams, compact: bool, penalised: bool):
    """``_draw_ops`` compiled (``mx.compile``), once per parameter set: the same operations,
    fused, so the same tokens, probabilities and ``exact`` flags bit for bit (tested), without
    the per-operation dispatch of ~60 small ops a token that made depth 0 ~0.8x mlx-lm
    (whose sampler is compiled) at temperature > 0."""
    ops = _draw_ops(params, compact)
    return mx.compile(ops if penalised else (lambda logits, key: ops(logits, key, None)))


def _draw(logits: mx.array, params: SamplingParams, counts, key,
          constraint: Constraint | None) -> int:
    """One token on the host, exactly as plain decoding draws it (one sync)."""
    if constraint is not None:
        logits = grammar.masked(logits, constraint.allowed())
    y, exact = _pick(logits, params, counts, key)
    if exact is not None and not exact.item():
        y, _ = _pick(logits, params, counts, key, dense=True)
    return int(y.item())


def _cut(reply: Reply, tokens: list[int], constraint: Constraint | None):
    tokens, reason = reply.cut(tokens)
    if constraint is not None:
        constraint.advance(tokens)
    return tokens, reason


def _keys(seed: int | None) -> Iterator[mx.array]:
    k = sampling.make_key(seed if seed is not None else random.getrandbits(62))
    while True:
        k, sub = _split_key(k)
        yield sub


@mx.compile
def _split_key(k: mx.array) -> tuple[mx.array, mx.array]:
    """``sampling.split_key(k, 2)`` compiled (integer ops: the same keys)."""
    a, b = sampling.split_key(k, 2)
    return a, b


def _controller(model, drafter: Drafter | None) -> AdaptiveDepth:
    """The depth controller: the model's own for its MTP head (what it learnt carries from
    one reply to the next, seeded from a saved tuning), a fresh one for a passed-in drafter."""
    initial = None
    try:
        initial = (store.read_tuned(model.info.path) or {}).get("adaptive_initial")
    except Exception:  # noqa: BLE001 - a missing/corrupt tuning file only costs warm-up
        log.debug("no saved tuning for %s", model.info.path, exc_info=True)
    if drafter is not None:
        return AdaptiveDepth(AUTO_MAX_DEPTH, initial=initial)
    max_d = min(model.info.max_depth or 3, AUTO_MAX_DEPTH)
    model.depth_controller = carry_over(model.depth_controller, max_d, initial=initial)
    return model.depth_controller


@dataclass
class _Step:
    """A queued plain step: its token (lazy), the logits, counts and key it was drawn with,
    and the compact sampler's ``exact`` flag (None: drawn densely or greedily)."""

    y: mx.array
    logits: mx.array
    counts: mx.array | None
    key: mx.array | None  # None when greedy
    exact: mx.array | None

    @classmethod
    def queue(cls, logits, params, counts, key) -> "_Step":
        y, exact = _pick(logits, params, counts, key)
        mx.async_eval(y if exact is None else [y, exact])
        return cls(y, logits, counts, key, exact)

    def redo_dense(self, params) -> None:
        self.y, self.exact = _pick(self.logits, params, self.counts, self.key, dense=True)


def _plain_stats(reply: Reply, session: Session, tokens: list[int], t_prev: float,
                 t_queued: float, now: float) -> CycleStats:
    """A plain step's stats: queuing it is ``t_verify``, waiting for its token ``t_sync``."""
    return CycleStats(
        index=reply.next_cycle(), depth=0, drafted=(), accepted=0, emitted=tuple(tokens),
        from_draft=(False,) * len(tokens), extra_kind="plain", t_verify=t_queued - t_prev,
        t_sync=now - t_queued, t_total=now - t_prev, context_tokens=len(session.fed))


def run_plain(session: Session, reply: Reply, params: SamplingParams,
              keys: Iterator[mx.array], x0: int) -> Iterator[Event]:
    """Depth 0, pipelined like mlx-lm: the next step is queued before reading this one. The
    wait on reading it is the step's ``t_sync``; ``t_verify`` is the host time queuing. A
    token the compact sampler drew at a tied top-k boundary is redrawn densely (the step
    queued on it is rewound first)."""
    draw = (lambda: None) if params.greedy else (lambda: next(keys))  # greedy: no keys
    cur = _Step.queue(session.step_plain(mx.array([x0])), params, reply.counts, draw())
    session.confirm(x0)
    t_prev = time.perf_counter()
    while True:
        if reply.cancelled:
            yield reply.cancel_event()
            return
        counts, mark = reply.counts, (None if cur.exact is None else session.mark())
        reply.count(cur.y[None])
        nxt = _Step.queue(session.step_plain(cur.y), params, reply.counts, draw())
        t_queued = time.perf_counter()
        if cur.exact is not None and not cur.exact.item():
            session.rewind(mark)
            cur.redo_dense(params)
            reply.counts = counts
            reply.count(cur.y[None])
            nxt = _Step.queue(session.step_plain(cur.y), params, reply.counts, nxt.key)
        tok = int(cur.y.item())
        session.confirm(tok)
        now = time.perf_counter()
        tokens, reason = reply.cut([tok])
        stats = _plain_stats(reply, session, tokens, t_prev, t_queued, now)
        t_prev = now
        ev = reply.emit(tokens, reason, stats=stats, counted=True)
        yield ev
        if ev.finish_reason is not None:
            mx.eval(nxt.y)
            return
        cur = nxt


def run_plain_constrained(session: Session, reply: Reply, params: SamplingParams,
                          keys: Iterator[mx.array], x0: int,
                          constraint: Constraint) -> Iterator[Event]:
    """Depth 0 under a grammar: not pipelined (the next token's mask needs this token)."""
    x, t_prev = x0, time.perf_counter()
    while True:
        if reply.cancelled:
            yield reply.cancel_event()
            return
        logits = session.step_plain(mx.array([x]))
        session.confirm(x)
        t_queued = time.perf_counter()
        tok = _draw(logits, params, reply.counts, None if params.greedy else next(keys),
                    constraint)
        now = time.perf_counter()
        tokens, reason = _cut(reply, [tok], constraint)
        stats = _plain_stats(reply, session, tokens, t_prev, t_queued, now)
        t_prev = now
        ev = reply.emit(tokens, reason, stats=stats)
        yield ev
        if ev.finish_reason is not None:
            return
        x = tok


def run_speculative(row: cycle.Row, x0: int, depth, controller: AdaptiveDepth | None, *,
                    profile: bool = False) -> Iterator[Event]:
    """Cycles overlap with the consumer: the next cycle's draft is launched before the
    current event is handed out; one that will not be verified is undone."""
    reply = row.reply

    def launch(x: int) -> cycle.Draft:
        k, reason = controller.choose() if controller else (depth, "fixed")
        k = max(0, min(int(k), reply.remaining - 1))
        return cycle.draft(row, x, k, reason, profile=profile)

    if reply.cancelled:
        yield reply.cancel_event()
        return
    pending = launch(x0)
    try:
        while pending is not None and not reply.cancelled:
            d, pending = pending, None
            ev, x0 = cycle.complete(row, d, profile=profile)
            if controller is not None:
                controller.observe(ev.stats)
            if ev.finish_reason is not None:
                yield ev
                return
            pending = None if reply.cancelled else launch(x0)
            yield ev
        if pending is not None:
            cycle.undo(row, pending)
            pending = None
        yield reply.cancel_event()
    finally:
        if pending is not None:  # launched, never verified: the consumer closed the reply
            cycle.undo(row, pending)
