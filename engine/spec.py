"""One speculative cycle: draft -> verify -> accept -> commit, synchronised once.

With ``profile`` each phase is evaluated on its own (4 syncs) so the dashboard's waterfall
shows true phase costs; otherwise the phases stay lazy, ``t_verify`` holds the single
synchronisation (draft + verify compute) and ``t_draft``/``t_accept`` the host time spent
building those graphs.
"""
from __future__ import annotations

import time

import mlx.core as mx

from engine import sampling
from engine.types import CycleStats, Event


def _draft(loop, x0: int, k: int, drafter):
    s, params = loop.session, loop.params
    if k == 0:
        return None, None, []
    if drafter is not None:
        proposed = drafter.propose(loop.generated, k)[:k]
        return mx.array(proposed, dtype=mx.int32), None, proposed
    drafts, q = s.draft_mtp(x0, k, params, loop.counts, next(loop.key))
    return drafts, q, None


def _accept(loop, ver, drafts, q, k: int):
    params, counts = loop.params, loop.counts
    d = drafts if drafts is not None else mx.zeros((0,), dtype=mx.int32)
    rows = None
    if counts is not None:
        rows = sampling.history_counts(counts, d)
    if params.greedy:
        targ = sampling.argmax_tokens(ver.logits, params, rows)
        return sampling.accept_greedy(targ, d)
    p = sampling.build_probs(ver.logits, params, rows)
    return sampling.accept_sampled(p, q, d, next(loop.key))


def run_cycle(loop, x0: int, k: int, depth_reason: str, drafter) -> tuple[Event, int]:
    s, prof = loop.session, loop.profile
    t0 = time.perf_counter()
    drafts, q, known = _draft(loop, x0, k, drafter)
    if drafts is not None:
        # start computing the drafts while the verify graph is built (not a host sync)
        (mx.eval if prof else mx.async_eval)(drafts)
    t1 = time.perf_counter()
    ver = s.verify(x0, drafts)
    (mx.eval if prof else mx.async_eval)(ver.logits)
    t2 = time.perf_counter()
    n_arr, nxt_arr = _accept(loop, ver, drafts, q, k)
    t3 = time.perf_counter()
    outs = [n_arr, nxt_arr] + ([drafts] if drafts is not None and known is None else [])
    mx.eval(outs)  # the cycle's one host synchronisation
    n, nxt = int(n_arr.item()), int(nxt_arr.item())
    dl = known if known is not None else (drafts.tolist() if drafts is not None else [])
    t4 = time.perf_counter()

    emitted = dl[:n] + [nxt]
    tokens, reason = loop._finish_for(emitted)
    keep = min(n, len(tokens))  # an EOS among the accepted drafts ends the reply there
    s.commit(x0, dl, keep, ver, drafted=k)
    if prof:
        mx.eval([c.state for c in s.trunk_cache])
    t5 = time.perf_counter()

    loop.generated.extend(tokens)
    loop._count(tokens)
    text, reason = loop._text(tokens, reason)
    loop.cycle += 1
    from_draft = tuple(i < n for i in range(len(tokens)))
    extra = "none" if len(tokens) <= n else ("bonus" if n == k else "correction")
    if prof:
        t_draft, t_verify, t_accept = t1 - t0, t2 - t1, t4 - t2
    else:
        t_draft, t_verify, t_accept = t1 - t0, t4 - t3, (t3 - t2)
    stats = CycleStats(
        index=loop.cycle, depth=k, drafted=tuple(dl), accepted=n, emitted=tuple(tokens),
        from_draft=from_draft, extra_kind=extra, t_draft=t_draft, t_verify=t_verify,
        t_accept=t_accept, t_commit=t5 - t4, t_total=t5 - t0, context_tokens=len(s.fed),
        host_syncs=4 if prof else 1, depth_reason=depth_reason)
    return Event(token_ids=tuple(tokens), text=text, stats=stats, finish_reason=reason), nxt
