"""One speculative cycle: draft -> verify -> accept -> commit, synchronised once.

A cycle is split in two so cycles overlap with the host's work: ``launch`` builds the draft
graph and starts it computing (``async_eval``, not a host sync) — the decode loop launches the
next cycle's draft *before* handing the current event to the consumer; ``complete`` builds the
verify forward and the acceptance, synchronises once, and commits.

With ``profile`` each phase is evaluated on its own (4 syncs) so the dashboard's waterfall
shows true phase costs; otherwise phases overlap, ``t_verify`` holds the single
synchronisation and ``t_draft``/``t_accept`` the host time spent building those graphs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx

from engine import sampling
from engine.types import CycleStats, Event


@dataclass
class Launched:
    x0: int
    k: int
    reason: str
    drafts: mx.array | None
    q: mx.array | None
    known: list[int] | None   # replayed drafts (already on the host)
    t0: float
    t_draft: float


def launch(loop, x0: int, k: int, reason: str, drafter) -> Launched:
    """Draft k tokens after x0 and start computing them."""
    t0 = time.perf_counter()
    drafts = q = known = None
    if k > 0 and drafter is not None:
        known = drafter.propose(loop.generated, k)[:k]
        drafts = mx.array(known, dtype=mx.int32)
    elif k > 0:
        drafts, q = loop.session.draft_mtp(x0, k, loop.params, loop.counts, next(loop.key))
        (mx.eval if loop.profile else mx.async_eval)(drafts)
    return Launched(x0=x0, k=k, reason=reason, drafts=drafts, q=q, known=known, t0=t0,
                    t_draft=time.perf_counter() - t0)


def abandon(loop, lc: Launched) -> None:
    """Undo a launched draft that will never be verified (cancel between cycles)."""
    if lc.k > 0 and lc.known is None:
        loop.session.undo_draft(lc.k)


def _accept(loop, ver, drafts, q):
    params, counts = loop.params, loop.counts
    d = drafts if drafts is not None else mx.zeros((0,), dtype=mx.int32)
    rows = None if counts is None else sampling.history_counts(counts, d)
    if params.greedy:
        targ = sampling.argmax_tokens(ver.logits, params, rows)
        return sampling.accept_greedy(targ, d)
    p = sampling.build_probs(ver.logits, params, rows)
    return sampling.accept_sampled(p, q, d, next(loop.key))


def complete(loop, lc: Launched) -> tuple[Event, int]:
    """Verify, accept (one host sync), commit; returns the cycle's event and the next x0."""
    s, prof, k = loop.session, loop.profile, lc.k
    t1 = time.perf_counter()
    ver = s.verify(lc.x0, lc.drafts)
    (mx.eval if prof else mx.async_eval)(ver.logits)
    t2 = time.perf_counter()
    n_arr, nxt_arr = _accept(loop, ver, lc.drafts, lc.q)
    t3 = time.perf_counter()
    outs = [n_arr, nxt_arr] + ([lc.drafts] if lc.drafts is not None and lc.known is None else [])
    mx.eval(outs)  # the cycle's one host synchronisation
    n, nxt = int(n_arr.item()), int(nxt_arr.item())
    dl = lc.known if lc.known is not None else (lc.drafts.tolist() if lc.drafts is not None else [])
    t4 = time.perf_counter()

    tokens, reason = loop._finish_for(dl[:n] + [nxt])
    keep = min(n, len(tokens))  # an EOS among the accepted drafts ends the reply there
    s.commit(lc.x0, dl, keep, ver, drafted=k)
    if prof:
        mx.eval([c.state for c in s.trunk_cache])
    t5 = time.perf_counter()

    loop.generated.extend(tokens)
    loop._count(tokens)
    text, reason = loop._text(tokens, reason)
    loop.cycle += 1
    extra = "none" if len(tokens) <= n else ("bonus" if n == k else "correction")
    if prof:
        t_verify, t_accept = t2 - t1, t4 - t2
    else:
        t_verify, t_accept = t4 - t3, t3 - t1
    stats = CycleStats(
        index=loop.cycle, depth=k, drafted=tuple(dl), accepted=n, emitted=tuple(tokens),
        from_draft=tuple(i < n for i in range(len(tokens))), extra_kind=extra,
        t_draft=lc.t_draft, t_verify=t_verify, t_accept=t_accept, t_commit=t5 - t4,
        t_total=t5 - lc.t0, context_tokens=len(s.fed), host_syncs=4 if prof else 1,
        depth_reason=lc.reason)
    return Event(token_ids=tuple(tokens), text=text, stats=stats, finish_reason=reason), nxt
