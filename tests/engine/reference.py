"""The exactness oracle: a naive, single-row reference for what the engine's one decoder
(``engine.decoding``) does in a batch. Nothing here is used by the product.

- ``head_draft``: the MTP head's k drafts after ``x0`` on one ``Session`` (MTP_SPEC §2: step 1
  on (last trunk hidden, x0) plus the pending committed pairs, each later step on the head's
  own output and the previous draft), drawn with ``drafters.pick_draft`` in the given mode.
- ``plain_step``: one trunk step of one token on a session's caches (the trunk forward a
  depth-0 row takes), returning the next logits [1, V].
"""
from __future__ import annotations

import mlx.core as mx

from engine.decoding.drafters import DraftRequest, Proposal, draft_counts, pick_draft, stack_q
from engine.decoding.session import Session
from engine.sampling import exact as sampling, grammar


def _head(session: Session, hidden: mx.array, tokens: mx.array) -> mx.array:
    model = session.model
    emb = model.embed(tokens)
    return model.mtp(hidden, emb, session.mtp_cache)


def head_draft(session: Session, request: DraftRequest, mode: str = "filtered") -> Proposal:
    """``request.k`` drafts from the MTP head alone (the session's MTP cache grows by them)."""
    s, params, k = session, request.params, request.k
    hs = [s.last_hidden] if s.pending_h is None else [s.pending_h, s.last_hidden]
    hidden = mx.concatenate(hs, axis=1) if len(hs) > 1 else hs[0]
    out = _head(s, hidden, mx.array(s.pending_tok + [request.x0])[None])[:, -1:]
    s.mtp_rows += len(s.pending_tok) + 1
    s.pending_h, s.pending_tok = None, []
    keys = sampling.split_key(request.key, k) if not params.greedy else [None] * k
    drafts, qs, host = [], [], []
    for j in range(k):
        logits = s.model.draft_logits(out[:, -1])
        if request.allowed is not None:
            logits = grammar.masked(logits, request.allowed(host))
        d, q = pick_draft(logits, params, draft_counts(request.counts, drafts), keys[j], mode)
        drafts.append(d)
        if q is not None:
            qs.append(q)
        if request.allowed is not None:
            host.append(int(d.item()))
        if j + 1 < k:
            out = _head(s, out, d.reshape(1, 1))
    return Proposal(tokens=mx.stack(drafts), q=stack_q(qs))


def plain_step(session: Session, token: int) -> mx.array:
    """Feed ``token`` to the session's trunk and return the next logits [1, V]."""
    h, _ = session.model.forward_hidden(mx.array([[token]]), session.trunk_cache)
    session.fed.append(token)
    return session.model.lm_head(h)[:, -1]
