"""Prompts admitted together, prefilled in one forward (left-padded).

Four short requests that arrive at once used to pay four prefill forwards, one after the
other, before the batch's first cycle (on the demo, 4 x ~23 ms for ~25-token chat prompts).
Here they run as one trunk forward over [B, L]: each prompt left-padded to the longest, the
attention layers through mlx-lm's ``BatchKVCache`` (its mask keeps a row's queries off the
padding, its per-row offsets give each row the positions it has alone) and the Gated DeltaNet
layers through the chunked prefill with the padding masked (a padded position feeds the conv
zeros and leaves the state as it was: ``engine.models.trunk.gdn_prefill``). Each row then
becomes the ``Session`` it would be after prefilling alone: its own slice of every cache, its
last hidden and logits, its pairs for the MTP head (flushed as ``Session._feed`` does) and, at
the chat template's checkpoint (the same distance from the end in every row, so one index of
the padded forward), the snapshot the prompt cache keeps.

Only where it is exact up to float rounding, as a batch's rows are (``decoder``'s module
docstring): fresh sessions (nothing reused from the prompt cache), text only, on a model
whose forward can give the state inside a chunk (``Model.marks``: the CPU branch's chunked
prefill) and whose caches are mlx-lm's ``KVCache`` and ``ArraysCache``. Everything else
prefills alone, as before.
"""
from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache

from engine.decoding.session import Session
from engine.models.trunk import GDNCapture

MIN_ROWS = 2


def supported(model, tokens: int) -> bool:
    """Whether prompts padded to ``tokens`` can prefill together on this model."""
    if not model.marks(tokens):
        return False
    return all(type(c) in (KVCache, ArraysCache) for c in model.make_cache())


def prefill(model, sessions: list[Session], prompts: list[list[int]],
            back: int | None) -> None:
    """Feed each fresh session its whole prompt in one padded forward; the sessions end as
    ``Session.prefill_chunks`` leaves them (``last_logits`` set). ``back``: every prompt's
    checkpoint lies that many tokens before its end; each session's ``marked`` is then the
    state there (as ``prefill_chunks(..., mark=len(prompt) - back)`` gives)."""
    B, L = len(prompts), max(len(p) for p in prompts)
    pads = [L - len(p) for p in prompts]
    for s, p in zip(sessions, prompts):
        if s.fed or s.last_hidden is not None:
            raise ValueError("prefilling together needs fresh sessions")
        if back is not None and not 0 < back < len(p):
            raise ValueError(f"no checkpoint {back} tokens before the end of {len(p)}")
    mark = None if back is None else L - back
    cache = [BatchKVCache(pads) if type(c) is KVCache else ArraysCache(len(c.cache), pads)
             for c in model.make_cache()]
    tokens = mx.array([[0] * pad + p for pad, p in zip(pads, prompts)])
    h, caps = model.forward_hidden(tokens, cache, mark=mark)
    logits = model.lm_head(h[:, -1])
    for b, (s, p, pad) in enumerate(zip(sessions, prompts, pads)):
        row_h = h[b:b + 1, pad:]
        for mine, theirs in zip(s.trunk_cache, cache):
            if isinstance(theirs, BatchKVCache):
                mine.keys = theirs.keys[b:b + 1, :, pad:L]
                mine.values = theirs.values[b:b + 1, :, pad:L]
                mine.offset = len(p)
            else:
                mine.cache = [a[b:b + 1] for a in theirs.cache]
        s._queue_pairs(p, row_h)
        s.last_hidden = row_h[:, -1:]
        s.fed.extend(p)
        if s.use_mtp:
            s.flush_pending()
        s.marked = None
        if back is not None:
            row_caps = {i: GDNCapture(conv=[c.conv[0][b:b + 1]], state=[c.state[0][b:b + 1]])
                        for i, c in caps.items()}
            s.marked = s._snapshot_back(back, row_h, row_caps)
        s.last_logits = logits[b:b + 1]
