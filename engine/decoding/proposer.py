"""Proposing: every row's drafts for one cycle.

With the MTP head the batch drafts for all rows at once: ``max k`` head forwards over [B, ·];
row b samples its first ``k_b`` drafts exactly as it would alone (its keys, its penalties,
its grammar's mask, its draft mode; ``drafters.pick_draft``). Rows with the same sampling
parameters and depth draw each step in one compiled call (``plan.Group``). A batch without
the head asks each row's own ``Drafter`` (e.g. ``ReplayDrafter``).
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from engine.decoding.batch_caches import Batch
from engine.decoding.draft_vocab import DraftVocab
from engine.decoding.drafters import DraftRequest, Proposal, draft_counts, pick_draft, stack_q
from engine.decoding.plan import Cycle, Group
from engine.decoding.stream import Row
from engine.sampling import candidates, grammar
from engine.types import SamplingParams


@dataclass
class _Drafts:
    """Every row's drafts so far in one batched draft."""

    keys: list[mx.array | None]     # row b's keys [k, 2] for its draft steps (None: greedy)
    tokens: list[list[mx.array]]
    qs: list[list]                  # the q rows they were drawn from (none when argmax)
    host: list[list[int]]           # a constrained row's drafts on the host (for its masks)


def propose(batch: Batch, rows: list[Row], x0s: list[int], c: Cycle) -> list[Proposal | None]:
    """Each row's proposal for depths ``c.ks`` (None: no drafts, or drawn in a group). Sets
    ``c.grid`` and ``c.groups`` when the MTP head drafts."""
    ks = c.ks
    if max(ks) == 0:
        return [None] * len(ks)
    if batch.use_mtp:
        return _propose_mtp(batch, rows, x0s, c)
    out: list[Proposal | None] = []
    for r, x0, k in zip(rows, x0s, ks):
        out.append(None if k == 0 else r.drafter.draft(DraftRequest(
            x0=x0, k=k, generated=r.reply.generated, params=r.params, counts=r.reply.counts,
            key=None if r.params.greedy else next(r.keys),
            allowed=r.constraint.allowed if r.constraint else None)))
    return out


def _propose_mtp(batch: Batch, rows: list[Row], x0s: list[int], c: Cycle,
                 ) -> list[Proposal | None]:
    """The MTP head drafts for every row at once. Sets ``c.grid`` [B, max k]: each step's
    tokens (a row past its depth carries filler), and ``c.groups`` (rows drawn together:
    their proposals are None)."""
    ks = c.ks
    keys = [None if k == 0 or r.params.greedy else mx.random.split(next(r.keys), k)
            for r, k in zip(rows, ks)]
    greedy = all(r.greedy_fast for r in rows)
    drafts = _Drafts(keys=keys, tokens=[[] for _ in rows], qs=[[] for _ in rows],
                     host=[[] for _ in rows])
    sub = _draft_vocab(batch, rows, ks)
    out = batch.mtp_first(x0s)
    columns = []
    for j in range(max(ks)):
        logits = batch.logits(out[:, -1], sub)  # [B, V] ([B, N] on a draft vocabulary)
        if greedy:  # argmax for every row at once (what a greedy row drafts alone)
            col = mx.argmax(logits, axis=-1).astype(mx.int32)
            col = col if sub is None else sub.to_vocab(col)
        else:
            c.groups = _groups(rows, ks, keys, logits) if j == 0 else c.groups
            col = _column(rows, ks, j, logits, drafts, c, sub)
        columns.append(col)
        if j + 1 < max(ks):
            out = batch.mtp_next(out, col)
    c.grid = mx.stack(columns, axis=1)
    grouped = c.grouped
    return [Proposal(tokens=c.grid[b, :k] if greedy else mx.stack(drafts.tokens[b]),
                     q=stack_q(drafts.qs[b])) if k and b not in grouped else None
            for b, k in enumerate(ks)]


def _draft_vocab(batch: Batch, rows: list[Row], ks: list[int]) -> DraftVocab | None:
    """The batch's draft vocabulary (``engine.decoding.draft_vocab``) for this cycle, or None
    (the whole vocabulary) when a drafting row has a grammar or its recent tokens lie outside
    the set too often."""
    sub = batch.current_draft_vocab()
    if sub is None:
        return None
    for r, k in zip(rows, ks):
        if k and (r.constraint is not None or not sub.fits(r.recent())):
            return None
    return sub


def _compact(r: Row, logits: mx.array) -> bool:
    """Whether ``pick_draft`` draws row ``r`` with ``candidates.compiled_draft`` (and its
    acceptance runs on ``compiled_accept``)."""
    return (r.draft_mode == "filtered" and not r.params.greedy
            and candidates.applies(r.params, logits.shape[-1], logits.dtype))


def _groups(rows: list[Row], ks: list[int], keys: list, logits: mx.array) -> list[Group]:
    """The cycle's ``Group``s of two rows or more."""
    by: dict[tuple[SamplingParams, int], list[int]] = {}
    for b, (r, k) in enumerate(zip(rows, ks)):
        if k and r.constraint is None and r.reply.counts is None and _compact(r, logits):
            by.setdefault((r.params, k), []).append(b)
    return [Group(params=p, k=k, rows=bs, draft_keys=mx.stack([keys[b] for b in bs]))
            for (p, k), bs in by.items() if len(bs) > 1]


def _column(rows: list[Row], ks: list[int], j: int, logits: mx.array, drafts: _Drafts,
            c: Cycle, sub: DraftVocab | None = None) -> mx.array:
    """Draft step j of every row [B] (0 past a row's depth): each of ``c.groups`` in one
    call, every other row on its own. ``sub``: ``logits`` score its rows only; the drafts and
    their q are put back on vocabulary ids."""
    grouped = c.grouped
    idx, vals = [], []
    for b, (r, k) in enumerate(zip(rows, ks)):
        if j < k and b not in grouped:
            idx.append(mx.array([b], dtype=mx.int32))
            vals.append(_pick(r, logits[b:b + 1], drafts, b, j, sub)[None])
    for g in c.groups:
        if j >= g.k:
            continue
        whole = len(g.rows) == len(rows)
        tok, ids, probs, exact = candidates.compiled_draft_rows(g.params)(
            logits if whole else mx.take(logits, g.index, axis=0), g.draft_keys[:, j])
        if sub is not None:
            tok, ids = sub.to_vocab(tok), sub.to_vocab(ids)
        g.ids.append(ids)
        g.probs.append(probs)
        g.exact.append(exact)
        if whole:
            return tok
        idx.append(g.index)
        vals.append(tok)
    col = mx.zeros((len(rows),), dtype=mx.int32)
    return col.at[mx.concatenate(idx)].add(mx.concatenate(vals)) if idx else col


def _pick(r: Row, logits: mx.array, drafts: _Drafts, b: int, j: int,
          sub: DraftVocab | None = None) -> mx.array:
    """Row b's draft j from the head's logits [1, V] (``sub``: [1, N] on its rows; the draft
    and its q come back on vocabulary ids): under its grammar's mask after its drafts so far
    (read back to the host for that; a grammar never drafts on ``sub``)."""
    if r.constraint is not None:
        logits = grammar.masked(logits, r.constraint.allowed(drafts.host[b]))
    counts = draft_counts(r.reply.counts, drafts.tokens[b])
    d, q = pick_draft(logits, r.params, counts if sub is None else sub.counts(counts),
                      None if drafts.keys[b] is None else drafts.keys[b][j], r.draft_mode)
    if sub is not None:
        d = sub.to_vocab(d)
        if isinstance(q, candidates.Candidates):
            q = candidates.Candidates(sub.to_vocab(q.ids), q.probs, q.exact)
        elif q is not None:
            q = sub.dense(q)
    drafts.tokens[b].append(d)
    if q is not None:
        drafts.qs[b].append(q)
    if r.constraint is not None:
        drafts.host[b].append(int(d.item()))
    return d
