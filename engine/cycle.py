"""One speculative cycle, in four functions: draft → verify → accept → commit.

Each function takes a ``Row`` — one reply's decode state: its ``Session`` (caches), its
``Drafter``, its ``Reply`` (emitted tokens, penalty counts, finishing) and its random keys —
plus the typed results of the earlier steps, and nothing else. A batch of rows will run
through the same functions; a row never reaches into another.

1. ``draft`` builds the draft graph and starts it computing (``async_eval``, no host sync):
   the decode loop launches the next cycle's draft *before* handing the current event to
   the consumer. ``undo`` forgets a draft that will never be verified.
2. ``verify``: ONE trunk forward over [x0, d1..dk], capturing every Gated DeltaNet state.
3. ``accept``: exact acceptance (MTP_SPEC §5) → n accepted drafts and the extra token
   (correction or bonus), still lazy.
4. ``commit``: keep x0 and the first ``keep`` drafts in the caches.

``complete`` chains 2–4 around the cycle's single host synchronisation and emits the event.
Timing: without ``profile``, ``t_draft``/``t_verify``/``t_accept`` are the host time spent
building those graphs and ``t_sync`` is the wait in the one synchronisation (where the work of
every phase finishes); with ``profile`` each phase is evaluated on its own (4 syncs), so the
phase times are true costs and ``t_sync`` is 0.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx

from engine import candidates, grammar, sampling
from engine.drafters import Drafter, DraftRequest, Proposal
from engine.grammar import Constraint
from engine.reply import Reply
from engine.session import Session, Verified
from engine.types import CycleStats, Event, SamplingParams


@dataclass
class Row:
    """One reply's decode state, as the cycle functions see it."""

    session: Session
    drafter: Drafter
    reply: Reply
    params: SamplingParams
    keys: Iterator[mx.array]  # a fresh random key per use, in a fixed order (seeded)
    constraint: Constraint | None = None  # structured output (``engine.grammar``)


@dataclass(frozen=True)
class Draft:
    """A launched (not yet verified) draft of ``k`` tokens after the pending token ``x0``."""

    x0: int
    k: int
    reason: str                 # why this depth (the depth controller's word, or "fixed")
    proposal: Proposal | None   # None when k == 0
    t0: float                   # when the cycle started
    t_draft: float


@dataclass(frozen=True)
class Verdict:
    """Exact acceptance's result, lazy: ``n`` [] drafts accepted, ``extra`` [] the token that
    follows them (the correction at the first rejection, or the bonus). ``exact`` [] bool,
    when the compact sampler was used: False means a target row tied at its top-k boundary,
    and ``complete`` redoes the acceptance densely (``key`` is the key it used)."""

    n: mx.array
    extra: mx.array
    exact: mx.array | None = None
    key: mx.array | None = None


def draft(row: Row, x0: int, k: int, reason: str, *, profile: bool = False) -> Draft:
    """Step 1: draft k tokens after x0 and start computing them."""
    t0 = time.perf_counter()
    proposal = None
    if k > 0:
        request = DraftRequest(x0=x0, k=k, generated=row.reply.generated, params=row.params,
                               counts=row.reply.counts,
                               key=None if row.params.greedy else next(row.keys),
                               allowed=row.constraint.allowed if row.constraint else None)
        proposal = row.drafter.draft(request)
        (mx.eval if profile else mx.async_eval)(proposal.tokens)
    return Draft(x0=x0, k=k, reason=reason, proposal=proposal, t0=t0,
                 t_draft=time.perf_counter() - t0)


def undo(row: Row, d: Draft) -> None:
    """Forget a launched draft that will never be verified (cancel, an early close)."""
    if d.proposal is not None:
        row.drafter.undo(d.proposal)


def verify(row: Row, d: Draft, *, profile: bool = False) -> Verified:
    """Step 2: the trunk forward over [x0, d1..dk] (lazy unless profiled)."""
    ver = row.session.verify(d.x0, d.proposal.tokens if d.proposal else None)
    (mx.eval if profile else mx.async_eval)(ver.logits)
    return ver


def accept(row: Row, d: Draft, ver: Verified, *, key: mx.array | None = None,
           dense: bool = False) -> Verdict:
    """Step 3: exact acceptance of the drafts against the verify rows. Penalty counts of row
    i include the drafts before it, as plain decoding would have counted them. Top-k sampling
    runs on the compact candidates (``engine.candidates``) unless ``dense``."""
    params, counts = row.params, row.reply.counts
    drafts = d.proposal.tokens if d.proposal else mx.zeros((0,), dtype=mx.int32)
    rows = None if counts is None else sampling.history_counts(counts, drafts)
    logits = ver.logits
    if row.constraint is not None:  # every verified row under the grammar after its drafts
        logits = grammar.masked(logits, row.constraint.allowed_rows(drafts.tolist()))
    if params.greedy:
        target = sampling.argmax_tokens(logits, params, rows)
        return Verdict(*sampling.accept_greedy(target, drafts))
    key = next(row.keys) if key is None else key
    q = d.proposal.q if d.proposal else None
    vocab = logits.shape[-1]
    if not dense and candidates.applies(params, vocab, logits.dtype) and \
            (q is None or isinstance(q, candidates.Candidates)):
        n, extra, exact = candidates.accept_compiled(logits, params, rows, q, drafts, key)
        return Verdict(n, extra, exact=exact, key=key)
    if isinstance(q, candidates.Candidates):
        q = q.dense(vocab)
    p = sampling.build_probs(logits, params, rows)
    return Verdict(*sampling.accept_sampled(p, q, drafts, key), key=key)


def commit(row: Row, d: Draft, ver: Verified, drafted: list[int], keep: int) -> None:
    """Step 4: keep x0 and the first ``keep`` drafts (trim attention KV, select the captured
    GDN step, drop the speculative MTP rows, queue the accepted MTP pairs)."""
    row.session.commit(d.x0, drafted, keep, ver, drafted=d.k)


def _sync(row: Row, d: Draft, ver: Verified, verdict: Verdict) -> tuple[int, int, list[int]]:
    """The cycle's one host synchronisation: (n, extra token, drafted ids). A compact
    acceptance whose target rows tied at the top-k boundary is redone densely (a second sync,
    only then), so the emitted tokens always follow ``sampling.build_probs``."""
    outs = [verdict.n, verdict.extra] + ([d.proposal.tokens] if d.proposal else [])
    mx.eval(outs + ([verdict.exact] if verdict.exact is not None else []))
    if verdict.exact is not None and not verdict.exact.item():
        verdict = accept(row, d, ver, key=verdict.key, dense=True)
        mx.eval(verdict.n, verdict.extra)
    drafted = d.proposal.tokens.tolist() if d.proposal else []
    return int(verdict.n.item()), int(verdict.extra.item()), drafted


def complete(row: Row, d: Draft, *, profile: bool = False) -> tuple[Event, int]:
    """Verify, accept, synchronise once, commit and emit; returns the cycle's event and the
    next pending token (the extra one)."""
    t1 = time.perf_counter()
    ver = verify(row, d, profile=profile)
    t2 = time.perf_counter()
    verdict = accept(row, d, ver)
    t3 = time.perf_counter()
    n, extra, drafted = _sync(row, d, ver, verdict)
    t4 = time.perf_counter()
    tokens, reason = row.reply.cut(drafted[:n] + [extra])
    if row.constraint is not None:
        row.constraint.advance(tokens)
    keep = min(n, len(tokens))  # an EOS among the accepted drafts ends the reply there
    commit(row, d, ver, drafted, keep)
    if profile:
        mx.eval([c.state for c in row.session.trunk_cache])
    t5 = time.perf_counter()
    stats = CycleStats(
        index=row.reply.next_cycle(), depth=d.k, drafted=tuple(drafted), accepted=n,
        emitted=tuple(tokens), from_draft=tuple(i < n for i in range(len(tokens))),
        extra_kind=_extra_kind(len(tokens), n, d.k), t_draft=d.t_draft,
        t_verify=t2 - t1, t_accept=(t4 if profile else t3) - t2,
        t_sync=0.0 if profile else t4 - t3, t_commit=t5 - t4, t_total=t5 - d.t0,
        context_tokens=len(row.session.fed), host_syncs=4 if profile else 1,
        depth_reason=d.reason)
    return row.reply.emit(tokens, reason, stats=stats), extra


def _extra_kind(emitted: int, n: int, k: int) -> str:
    if emitted <= n:
        return "none"  # the reply ended on an accepted draft
    return "bonus" if n == k else "correction"
