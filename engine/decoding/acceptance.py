"""Accepting: exact acceptance of each row's drafts against the verify forward (MTP_SPEC §5),
and the cycle's one host synchronisation.

A row's acceptance uses its own parameters, penalty counts (each verified position counts
the drafts before it, as plain decoding would have), grammar mask and next random key; a
depth-0 row draws one token as plain decoding does; greedy rows without penalties or a grammar
are judged on the host from the verify argmax. ``sync`` reads every row's result at once; a
row whose compact (top-k) acceptance tied at the boundary is redone densely, only then a
second sync, so the emitted tokens always follow ``sampling.build_probs``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from engine.decoding import draw
from engine.decoding.drafters import Proposal
from engine.decoding.plan import Cycle, Group, RowResult
from engine.decoding.stream import Row, Stream
from engine.sampling import candidates, exact as sampling, grammar


@dataclass(frozen=True)
class Verdict:
    """Exact acceptance's result, lazy: ``n`` [] drafts accepted, ``extra`` [] the token that
    follows them (the correction at the first rejection, or the bonus). ``exact`` [] bool,
    when the compact sampler was used: False means a target row tied at its top-k boundary,
    and the acceptance is redone densely with the same ``key``."""

    n: mx.array
    extra: mx.array
    exact: mx.array | None = None
    key: mx.array | None = None


def accept(row: Row, proposal: Proposal | None, logits: mx.array, *,
           key: mx.array | None = None, dense: bool = False) -> Verdict:
    """Exact acceptance of ``proposal``'s drafts against the verify rows ``logits`` [k+1, V].
    Top-k sampling runs on the compact candidates (``engine.sampling.candidates``) unless ``dense``."""
    params, counts = row.params, row.reply.counts
    drafts = proposal.tokens if proposal else mx.zeros((0,), dtype=mx.int32)
    rows = None if counts is None else sampling.history_counts(counts, drafts)
    if row.constraint is not None:  # every verified row under the grammar after its drafts
        logits = grammar.masked(logits, row.constraint.allowed_rows(drafts.tolist()))
    if params.greedy:
        target = sampling.argmax_tokens(logits, params, rows)
        return Verdict(*sampling.accept_greedy(target, drafts))
    key = next(row.keys) if key is None else key
    q = proposal.q if proposal else None
    vocab = logits.shape[-1]
    if not dense and candidates.applies(params, vocab, logits.dtype) and \
            (q is None or isinstance(q, candidates.Candidates)):
        n, extra, exact = candidates.accept_compiled(logits, params, rows, q, drafts, key)
        return Verdict(n, extra, exact=exact, key=key)
    if isinstance(q, candidates.Candidates):
        q = q.dense(vocab)
    p = sampling.build_probs(logits, params, rows)
    return Verdict(*sampling.accept_sampled(p, q, drafts, key), key=key)


def accept_row(st: Stream, b: int, c: Cycle, plain_key: Callable[[Stream], mx.array], *,
               key: mx.array | None = None, dense: bool = False) -> Verdict:
    """Row b's acceptance (lazy); ``dense`` redoes it with the same ``key`` after a top-k
    tie. A depth-0 row draws one token as plain decoding does (``plain_key``: its key)."""
    k, r = c.ks[b], st.row
    logits = c.ver.logits[b, :k + 1]
    if not st.plain:
        return accept(r, c.proposals[b], logits, key=key, dense=dense)
    if key is None and not r.params.greedy:
        key = plain_key(st)
    if r.constraint is not None:
        logits = grammar.masked(logits, r.constraint.allowed())
    y, exact = draw.pick(logits, r.params, r.reply.counts, key, dense=dense)
    return Verdict(mx.array(0, dtype=mx.int32), y, exact=exact, key=key)


def accept_group(g: Group, streams: list[Stream], c: Cycle) -> None:
    """The group's acceptance, one call for its rows (lazy), each with its next key."""
    whole = len(g.rows) == len(streams)
    logits = c.ver.logits if whole else mx.take(c.ver.logits, g.index, axis=0)
    grid = c.grid if whole else mx.take(c.grid, g.index, axis=0)
    g.keys = mx.stack([next(streams[b].row.keys) for b in g.rows])
    g.verdict = candidates.compiled_accept_rows(g.params)(
        logits[:, :g.k + 1] if logits.shape[1] > g.k + 1 else logits, grid[:, :g.k],
        g.keys, mx.stack(g.ids, axis=1), mx.stack(g.probs, axis=1),
        mx.stack(g.exact, axis=1))


def lazy_outputs(c: Cycle, verdicts: list[Verdict | None]) -> list[mx.array]:
    """Every array the cycle's sync reads."""
    outs = [a for a in (c.target, c.grid) if a is not None]
    for g in c.groups:
        outs += list(g.verdict)
    for v, p in zip(verdicts, c.proposals):
        if v is not None:
            outs += [v.n, v.extra] + ([v.exact] if v.exact is not None else []) + \
                ([p.tokens] if p is not None and c.grid is None else [])
    return outs


def sync(c: Cycle, verdicts: list[Verdict | None],
         redo: Callable[[int, mx.array | None], Verdict]) -> list[RowResult]:
    """The cycle's one host synchronisation, for every row. Greedy rows (``verdicts[b]``
    None, not in a group) are judged here from the verify argmax, as
    ``sampling.accept_greedy`` does; ``redo(b, key)`` is row b's dense acceptance."""
    mx.eval(lazy_outputs(c, verdicts))
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
                results.append(RowResult(ns[i], extras[i], drafted))
                continue
            c.proposals[b] = Proposal(tokens=c.grid[b, :k], q=g.q(i))
            v = redo(b, g.keys[i])
        elif v is None:
            n = next((i for i, d in enumerate(drafted) if d != target[b][i]), k)
            results.append(RowResult(n, target[b][n], drafted))
            continue
        elif v.exact is not None and not v.exact.item():
            v = redo(b, v.key)
        results.append(RowResult(int(v.n.item()), int(v.extra.item()), drafted))
    return results


def extra_kind(emitted: int, n: int, k: int) -> str:
    """What the token after the accepted drafts was: "bonus" (all k accepted), "correction",
    or "none" (the reply ended on an accepted draft)."""
    if emitted <= n:
        return "none"
    return "bonus" if n == k else "correction"
