"""The decode state of B streams decoded together: ``Session``'s caches and invariants, per row.

A stream is prefilled alone (a ``Session``, chunked, its prompt cache reused), then ``join``s
the batch: its attention KV becomes a row of each ``RowKVCache`` (own length, own RoPE
positions), its Gated DeltaNet state a row of each ``ArraysCache``, its MTP cache a row of the
head's ``RowKVCache``. ``leave`` removes a row; ``extract`` gives it back as a ``Session`` (the
prompt cache keeps it for the conversation's next turn).

One cycle for all rows, in the order of ``engine.decoding.speculative``:
- ``mtp_first(x0s, active)``: one MTP forward over every row's pending committed pairs plus
  (last hidden, x0), right-padded to the longest row; ``mtp_next`` one more step for all rows.
  Every row runs as many head steps as the deepest row (``steps``); a shallower row ignores the
  extra drafts and ``commit`` drops every speculative MTP row (steps - 1 per row).
- ``verify(inputs)``: ONE trunk forward over [B, S] = each row's [x0, d1..dk] padded to
  S = deepest + 1 (padding sits after a row's own tokens, so causality keeps it out of them),
  capturing every GDN step.
- ``commit(keeps, ...)``: row b keeps x0 and its first keep_b drafts: its attention length
  moves back over the rest, its GDN state is the captured one at step keep_b, its MTP
  speculative rows are dropped and its accepted pairs queued, as ``Session.commit`` does.

Invariants per row are ``Session``'s (MTP_SPEC §3): ``fed[b]`` is what row b's trunk consumed,
``last_hidden[b]`` the trunk hidden of its last fed token, and its MTP cache holds one row per
committed pair except ``pending`` ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from engine.decoding import draft_vocab, side
from engine.decoding.draft_vocab import DraftVocab
from engine.decoding.rowcache import RowKVCache, key_buckets
from engine.decoding.window import DRAFT_WINDOW, WINDOW_ENV, draft_window  # noqa: F401
from engine.decoding.session import Session


@dataclass
class Pending:
    """Row b's committed pairs not yet in its MTP cache: hiddens [n, H] and their tokens."""

    hidden: mx.array | None = None
    tokens: list[int] = field(default_factory=list)

    def add(self, hidden: mx.array, tokens: list[int]) -> None:
        if not tokens:
            return
        self.hidden = hidden if self.hidden is None else mx.concatenate([self.hidden, hidden])
        self.tokens.extend(tokens)


@dataclass
class BatchVerified:
    """The lazy result of one batched verify forward over [B, S]."""

    hidden: mx.array     # [B, S, H]
    logits: mx.array     # [B, S, V]
    captures: dict


class Batch:
    """See the module docstring. Rows are indexed 0..B-1 in join order (``leave`` keeps the
    order of the others)."""

    def __init__(self, model, *, use_mtp: bool, counts=None) -> None:
        self.model = model
        self.use_mtp = use_mtp and model.mtp is not None
        buckets = key_buckets()
        self.trunk_cache = [RowKVCache(buckets=buckets) if isinstance(c, KVCache)
                            else ArraysCache(len(c.cache)) for c in model.make_cache()]
        window = draft_window()
        self.mtp_cache = [RowKVCache(window=window, buckets=buckets)
                          for _ in model.mtp.make_cache()] if self.use_mtp else None
        # the rows a draft step scores when it may score part of the vocabulary, ranked by
        # ``counts`` (``draft_vocab.TokenCounts``, the carryover's; None: by id)
        self.counts = counts
        self._vocab_version = counts.version if counts is not None else 0
        self.draft_vocab = draft_vocab.for_model(model, counts) if self.use_mtp else None
        self.fed: list[list[int]] = []
        self.pending: list[Pending] = []
        self.tracked: list[bool] = []  # rows whose MTP cache is kept in step (see ``join``)
        self.media: list[tuple] = []    # each row's images (``Session.media``)
        self.rope_delta: list[int] = []  # each row's M-RoPE shift (``Session.rope_delta``)
        self.last_hidden: mx.array | None = None  # [B, 1, H]
        self._spec_mtp = 0  # speculative MTP rows per row from this cycle's head steps

    @property
    def size(self) -> int:
        return len(self.fed)

    # -- rows joining and leaving ---------------------------------------------------------
    def join(self, s: Session, *, track: bool = True) -> int:
        """Add a prefilled stream (``s`` must not be used afterwards); returns its row.
        ``track=False`` (a stream that never drafts: fixed depth 0) stops queueing its
        committed pairs for the head, as ``Session.step_plain`` does (its MTP cache falls out
        of step, so ``extract`` marks it ``mtp_ok=False``), instead of letting them pile up."""
        if s.last_hidden is None:
            raise ValueError("a stream joins after its prefill")
        if self.use_mtp and not s.mtp_ok:
            raise ValueError("this stream's MTP cache is not in step with its trunk")
        for mine, theirs in zip(self.trunk_cache, s.trunk_cache):
            if isinstance(mine, RowKVCache):
                mine.join(theirs, s.rope_delta)
            elif mine.cache[0] is None:  # the first row
                mine.cache = list(theirs.cache)
            else:
                mine.extend(theirs)
        if self.use_mtp:
            with side.side():  # only a draft reads it (``engine.decoding.side``)
                for mine, theirs in zip(self.mtp_cache, s.mtp_cache):
                    if theirs.keys is None:  # a one-token prompt: no pair committed yet
                        theirs = _empty_kv(self.model, s)
                    mine.join(theirs, s.rope_delta)
            side.start([a for c in self.mtp_cache for a in (c.keys, c.values)])
        p = Pending()
        if s.pending_h is not None:
            p.add(s.pending_h[0], list(s.pending_tok))
        self.pending.append(p)
        self.tracked.append(track and self.use_mtp)
        self.fed.append(list(s.fed))
        self.media.append(tuple(s.media))
        self.rope_delta.append(s.rope_delta)
        h = s.last_hidden[:, -1:]
        self.last_hidden = h if self.last_hidden is None else \
            mx.concatenate([self.last_hidden, h])
        return self.size - 1

    def leave(self, rows: list[int]) -> None:
        """Remove ``rows``; the others keep their order."""
        gone = set(rows)
        keep = [b for b in range(self.size) if b not in gone]
        idx = mx.array(keep, dtype=mx.int32)
        for c in self.trunk_cache + (self.mtp_cache or []):
            if isinstance(c, RowKVCache):
                c.take(keep)
            elif keep:
                c.filter(idx)
            else:
                c.cache = [None] * len(c.cache)
        self.fed = [self.fed[b] for b in keep]
        self.pending = [self.pending[b] for b in keep]
        self.tracked = [self.tracked[b] for b in keep]
        self.media = [self.media[b] for b in keep]
        self.rope_delta = [self.rope_delta[b] for b in keep]
        self.last_hidden = None if not keep else \
            mx.take(self.last_hidden, mx.array(keep, dtype=mx.int32), axis=0)

    def extract(self, b: int, mark: list | None = None) -> Session:
        """Row b as a stand-alone ``Session`` (copies; the batch is unchanged); with ``mark``
        (``mark()``), its trunk state as it was then (plain verifies since not committed)."""
        s = Session.fresh(self.model, use_mtp=self.use_mtp)
        mark = mark or [None] * len(self.trunk_cache)
        s.trunk_cache = [(c.extract(b, None if m is None else m[b]) if isinstance(c, RowKVCache)
                          else _extract_arrays(c if m is None else m, b))
                         for c, m in zip(self.trunk_cache, mark)]
        if self.use_mtp:
            s.mtp_cache = [c.extract(b) for c in self.mtp_cache]
            s.mtp_rows = self.mtp_cache[0].lengths[b]
            p = self.pending[b]
            s.pending_h = None if p.hidden is None else p.hidden[None]
            s.pending_tok = list(p.tokens)
        s.fed = list(self.fed[b])
        s.media = self.media[b]
        s.set_rope_delta(self.rope_delta[b])
        s.last_hidden = self.last_hidden[b:b + 1]
        s.last_logits = self.model.lm_head(s.last_hidden[:, -1])
        s.mtp_ok = self.tracked[b]
        return s

    def trunk_state(self) -> list:
        """Every trunk cache array (to evaluate them, e.g. when profiling)."""
        return [a for c in self.trunk_cache for a in
                ((c.keys, c.values) if isinstance(c, RowKVCache) else c.cache)]

    # -- the MTP head's forwards ------------------------------------------------------------
    def mtp_first(self, x0s: list[int]) -> mx.array:
        """Draft step 1 for every row: its pending pairs plus (last hidden, x0), right-padded;
        returns each row's MTP hidden for x0 [B, 1, H]."""
        embed = self.model.embed
        widths = [len(p.tokens) + 1 for p in self.pending]
        width = max(widths)
        hs, toks = [], []
        for b, p in enumerate(self.pending):
            h = self.last_hidden[b, -1:] if p.hidden is None else \
                mx.concatenate([p.hidden, self.last_hidden[b, -1:]])
            hs.append(_pad_rows(h, width))
            toks.append(p.tokens + [x0s[b]] + [0] * (width - widths[b]))
        last = mx.array([w - 1 for w in widths], dtype=mx.int32)
        out = self.model.mtp(mx.stack(hs), embed(mx.array(toks, dtype=mx.int32)),
                             self.mtp_cache, at=last)
        for c in self.mtp_cache:
            c.trim_rows([width - w for w in widths])
        self.pending = [Pending() for _ in self.pending]
        self._spec_mtp = 0
        return out

    def mtp_next(self, out: mx.array, tokens: mx.array) -> mx.array:
        """One more draft step for every row: the head on its own output and the token drafted
        at the step before (``tokens`` [B])."""
        embed = self.model.embed
        self._spec_mtp += 1
        return self.model.mtp(out, embed(tokens.reshape(-1, 1)), self.mtp_cache)

    def current_draft_vocab(self) -> DraftVocab | None:
        """``draft_vocab``, rebuilt once the counts have moved to a new version."""
        c = self.counts
        if self.draft_vocab is not None and c is not None and c.version != self._vocab_version:
            self._vocab_version = c.version
            self.draft_vocab = draft_vocab.for_model(self.model, c)
        return self.draft_vocab

    def logits(self, hidden: mx.array, sub: DraftVocab | None = None) -> mx.array:
        """The head's logits for ``hidden``: [..., V], or [..., N] on ``sub``'s rows."""
        if sub is None:
            return self.model.draft_logits(hidden)
        return sub.logits(self.model.draft_hidden(hidden))

    def undo_draft(self) -> None:
        """Forget this cycle's head steps (the cycle will not be verified)."""
        if self.use_mtp:
            for c in self.mtp_cache:
                c.trim(self._spec_mtp)
        self._spec_mtp = 0

    # -- verify and commit --------------------------------------------------------------------
    def verify(self, inputs: mx.array) -> BatchVerified:
        """ONE trunk forward over ``inputs`` [B, S] (each row's x0, drafts, padding). With
        S == 1 (no row drafted) nothing is rejected, so mlx-lm's own layers run (no captures)."""
        h, caps = self.model.forward_hidden(inputs, self.trunk_cache,
                                            capture=inputs.shape[1] > 1)
        return BatchVerified(hidden=h, logits=self.model.lm_head(h), captures=caps)

    def mark(self) -> list:
        """The trunk state before a plain verify (each attention cache's row lengths, each GDN
        cache's arrays: references, no copies), for ``rewind``."""
        return [list(c.lengths) if isinstance(c, RowKVCache) else list(c.cache)
                for c in self.trunk_cache]

    @staticmethod
    def take_mark(mark: list, rows: list[int]) -> list:
        """``mark`` for ``rows`` only (in that order), as ``leave`` keeps them."""
        idx = mx.array(rows, dtype=mx.int32)
        return [[m[b] for b in rows] if not m or isinstance(m[0], int) else
                [mx.take(a, idx, axis=0) for a in m] for m in mark]

    def rewind(self, mark: list) -> None:
        """Undo the plain verifies since ``mark`` for every row (none was committed): the
        positions they wrote lie past each row's length again and its GDN state is the old
        one. The head's cache and ``last_hidden`` are untouched by a plain verify."""
        for c, m in zip(self.trunk_cache, mark):
            if isinstance(c, RowKVCache):
                c.lengths = list(m)
            else:
                c.cache = list(m)

    def commit(self, inputs: list[list[int]], keeps: list[int], ver: BatchVerified, *,
               drafted: bool) -> None:
        """Row b keeps ``inputs[b][0]`` (its x0) and its first ``keeps[b]`` drafts.
        ``drafted``: the head ran this cycle (``mtp_first``)."""
        S = ver.hidden.shape[1]
        for c in self.trunk_cache:
            if isinstance(c, RowKVCache):
                c.trim_rows([S - 1 - k for k in keeps])
        for i, cap in ver.captures.items():
            self.trunk_cache[i][0] = _per_row(cap.conv, keeps)
            self.trunk_cache[i][1] = _per_row(cap.state, keeps)
        if self.use_mtp:
            self._commit_mtp(inputs, keeps, ver, drafted)
        for b, k in enumerate(keeps):
            self.fed[b].extend(inputs[b][:k + 1])
        self.last_hidden = _per_row([ver.hidden[:, j:j + 1] for j in range(S)], keeps)

    def _commit_mtp(self, inputs, keeps, ver: BatchVerified, drafted: bool) -> None:
        if drafted:
            for c in self.mtp_cache:
                c.trim(self._spec_mtp)
            self._spec_mtp = 0
        for b, k in enumerate(keeps):
            p = self.pending[b]
            if not self.tracked[b]:
                continue
            if not drafted:  # no head step ran: the pair (last hidden, x0) is pending too
                p.add(self.last_hidden[b, -1:], inputs[b][:1])
            if k:
                p.add(ver.hidden[b, :k], inputs[b][1:k + 1])


def _per_row(steps: list[mx.array], keeps: list[int]) -> mx.array:
    """Row b of ``steps[keeps[b]]`` for every row, in one fused pass (``_select``) with no
    stacking of all S steps (the GDN states are the big arrays of a cycle); none when all
    rows agree."""
    if len(set(keeps)) == 1:
        return steps[keeps[0]]
    used = sorted(set(keeps))  # only the steps some row keeps are read
    pick = mx.array([used.index(k) for k in keeps], dtype=mx.int32)
    return _select(pick.reshape((-1,) + (1,) * (steps[0].ndim - 1)), *[steps[k] for k in used])


@mx.compile
def _select(pick: mx.array, *steps: mx.array) -> mx.array:
    """``steps[pick[b]][b]`` for every row b: a chain of ``where`` that compiles into one
    kernel (a copy: the values are exactly the chosen steps')."""
    out = steps[0]
    for j in range(1, len(steps)):
        out = mx.where(pick == j, steps[j], out)
    return out


def _extract_arrays(cache: ArraysCache | list, b: int) -> ArraysCache:
    """Row b of a GDN cache (or of its arrays as ``mark`` kept them) as a stand-alone
    ``ArraysCache``: mlx-lm's ``extract``, copied so it does not hold the batch's buffers."""
    if isinstance(cache, list):
        whole = ArraysCache(len(cache))
        whole.cache = list(cache)
        cache = whole
    out = cache.extract(b)
    out.cache = [mx.contiguous(a) for a in out.cache]
    return out


def _pad_rows(h: mx.array, n: int) -> mx.array:
    return h if h.shape[0] == n else mx.pad(h, [(0, n - h.shape[0]), (0, 0)])


def _empty_kv(model, s: Session) -> KVCache:
    """An MTP cache row with no positions yet (shapes from the head's attention)."""
    c = KVCache()
    kshape, vshape = model.mtp.kv_shapes()
    c.keys = mx.zeros((1, kshape[0], 0, kshape[1]), s.last_hidden.dtype)
    c.values = mx.zeros((1, vshape[0], 0, vshape[1]), s.last_hidden.dtype)
    return c
