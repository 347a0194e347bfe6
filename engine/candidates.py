"""Exact top-k sampling that never sorts, exponentiates or draws noise over the vocabulary.

Contract: for a non-greedy ``SamplingParams`` with ``0 < top_k <= MAX_K`` (``applies``), the
distribution plain decoding samples from is supported on the ``top_k`` largest (penalised,
temperature-scaled) logits, so everything after the selection runs on ``k`` values:

1. penalties and temperature on the raw logits (two cheap elementwise passes, as
   ``sampling.build_probs`` does them);
2. the exact top ``k`` by value (:func:`top_k`): the vocabulary is cut into blocks of
   ``BLOCK``, the ``k`` blocks with the largest maxima are kept (they hold the top ``k``: see
   :func:`top_k`), and ``argpartition`` runs on those ``k·BLOCK`` values only;
3. softmax over the ``k`` values, top-p over their descending order (the same cut-off rule as
   ``sampling``: the smallest prefix with mass >= ``top_p``, ties with the cut-off kept),
   min-p, renormalise — all on ``[R, k]``.

``Candidates.exact`` [R] says that no token outside the ``k`` selected ties the ``k``-th value
(``sampling``'s tie rule then keeps exactly these ``k``). Where it is False (only when logits
tie exactly at the boundary, or fewer than ``k`` are finite) the caller must use the dense path
(``sampling.build_probs``) for that target row: ``engine.cycle`` and ``engine.decode`` check it
at their one host synchronisation and redo that step densely. A *draft* needs no check: any q
is exact as long as the draft was sampled from it, and a draft sampled from ``Candidates`` is.

Selection by block maxima, by ``argpartition`` on the whole row, and by a full sort give the
same values in the same order (tested bit for bit at V = 248,320 with ties), and the
probabilities are computed from those values by one function, so they are bit-identical too.

Lazy MLX only, like ``engine.sampling``: no host synchronisation here.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from engine import sampling
from engine.types import SamplingParams

BLOCK = 16        # vocabulary block for the two-stage selection
MAX_K = 256       # larger top-k values use the dense path
DIRECT_V = 4096   # below this vocabulary size, argpartition the whole row


def applies(params: SamplingParams, vocab: int, dtype=mx.float32) -> bool:
    """Whether the compact path computes ``params``' distribution (float32 logits only)."""
    return (not params.greedy and 0 < params.top_k <= MAX_K and params.top_k < vocab
            and dtype != mx.float64)


@dataclass(frozen=True)
class Candidates:
    """A filtered distribution on ``k`` tokens per row: ``ids`` [R, k] int32 in descending
    logit order, ``probs`` [R, k] (sum 1 per row, 0 for tokens top-p/min-p dropped),
    ``exact`` [R] bool (see the module docstring)."""

    ids: mx.array
    probs: mx.array
    exact: mx.array

    def row(self, i) -> "Candidates":
        """Row(s) ``i`` (an int, a slice or an int array), keeping the 2-D shape."""
        if isinstance(i, int):
            i = slice(i, i + 1)
        if isinstance(i, slice):
            return Candidates(self.ids[i], self.probs[i], self.exact[i])
        return Candidates(mx.take(self.ids, i, axis=0), mx.take(self.probs, i, axis=0),
                          mx.take(self.exact, i, axis=0))

    @staticmethod
    def stack(rows: list["Candidates"]) -> "Candidates":
        return Candidates(mx.concatenate([r.ids for r in rows]),
                          mx.concatenate([r.probs for r in rows]),
                          mx.concatenate([r.exact for r in rows]))

    def dense(self, vocab: int) -> mx.array:
        """The same distribution as ``[R, V]`` (zeros outside ``ids``)."""
        hit = mx.expand_dims(self.ids, -1) == mx.arange(vocab)  # [R, k, V]
        return mx.sum(mx.where(hit, mx.expand_dims(self.probs, -1), 0.0), axis=1)


def scaled_logits(logits: mx.array, params: SamplingParams, counts: mx.array | None = None):
    """Penalties then temperature, exactly as ``sampling.build_probs`` applies them."""
    x = sampling.apply_penalties(logits, counts, presence=params.presence_penalty,
                                 frequency=params.frequency_penalty)
    return x / params.temperature if params.temperature != 1.0 else x


def _descending(x: mx.array, idx: mx.array) -> tuple[mx.array, mx.array]:
    vals = mx.take_along_axis(x, idx, axis=-1)
    order = mx.argsort(-vals, axis=-1)
    return mx.take_along_axis(vals, order, axis=-1), mx.take_along_axis(idx, order, axis=-1)


def top_k(x: mx.array, k: int, *, method: str = "blocks") -> tuple[mx.array, mx.array]:
    """The ``k`` largest values of each row of ``x`` [R, V], descending, and their ids.

    ``method``: "blocks" (default), "partition" (argpartition of the whole row) or "sort"
    (a full sort: the reference). Blocks are exact: every value above the k-th lies in a
    block whose maximum is above it (fewer than k such blocks, all kept), and each kept block
    whose maximum equals the k-th value adds at least one value equal to it, so the kept
    blocks hold at least k values >= the k-th and their k largest values are the row's.
    """
    R, V = x.shape
    if method == "sort":
        idx = mx.argsort(-x, axis=-1)[:, :k]
    elif method == "partition" or V <= DIRECT_V or V % BLOCK:
        idx = mx.argpartition(x, V - k, axis=-1)[:, V - k:]
    else:
        nb = V // BLOCK
        bmax = mx.max(x.reshape(R, nb, BLOCK), axis=-1)
        blocks = mx.argpartition(bmax, nb - k, axis=-1)[:, nb - k:]          # [R, k]
        cand = (mx.expand_dims(blocks * BLOCK, -1) + mx.arange(BLOCK)).reshape(R, k * BLOCK)
        vals = mx.take_along_axis(x, cand, axis=-1)
        pick = mx.argpartition(vals, k * BLOCK - k, axis=-1)[:, k * BLOCK - k:]
        idx = mx.take_along_axis(cand, pick, axis=-1)
    return _descending(x, idx.astype(mx.int32))


def filter_probs(vals: mx.array, params: SamplingParams) -> mx.array:
    """Softmax of the descending top-k values, then top-p, min-p, renormalise: [R, k]."""
    p = sampling._softmax(vals)
    filtered = False
    if params.top_p < 1.0:
        before = mx.cumsum(p, axis=-1, inclusive=False)  # mass of the larger ones
        inf = mx.array(float("inf"), dtype=p.dtype)
        cutoff = mx.min(mx.where(before < params.top_p, p, inf), axis=-1, keepdims=True)
        p = mx.where(p >= cutoff, p, mx.zeros_like(p))
        filtered = True
    if params.min_p > 0.0:
        p = mx.where(p >= params.min_p * p[:, :1], p, mx.zeros_like(p))
        filtered = True
    return p / mx.sum(p, axis=-1, keepdims=True) if filtered else p


def build(logits: mx.array, params: SamplingParams, counts: mx.array | None = None, *,
          method: str = "blocks") -> Candidates:
    """The compact form of ``sampling.build_probs(logits, params, counts)`` (see ``applies``)."""
    x = scaled_logits(logits, params, counts)
    k = params.top_k
    vals, ids = top_k(x, k, method=method)
    exact = mx.sum(x >= vals[:, k - 1:k], axis=-1) == k
    return Candidates(ids=ids, probs=filter_probs(vals, params), exact=exact)


def sample(c: Candidates, key: mx.array) -> mx.array:
    """One draw per row -> [R] int32 token ids (Gumbel-max over the k probabilities)."""
    j = sampling.sample(c.probs, key)
    return mx.take_along_axis(c.ids, j[:, None], axis=-1)[:, 0]


def prob_of(c: Candidates, tokens: mx.array) -> mx.array:
    """``c``'s probability of ``tokens`` [R] (0 outside its ids) -> [R]."""
    hit = c.ids == tokens.reshape(-1, 1)
    return mx.sum(mx.where(hit, c.probs, mx.zeros_like(c.probs)), axis=-1)


def _q_on(q: Candidates | None, ids: mx.array, draft: mx.array, dtype) -> mx.array:
    """q (one row) evaluated at ``ids`` [K]; ``q`` None means the one-hot of ``draft``."""
    if q is None:
        return (ids == draft).astype(dtype)
    hit = mx.expand_dims(ids, -1) == q.ids  # [K, Kq]
    return mx.sum(mx.where(hit, q.probs, mx.zeros_like(q.probs)), axis=-1).astype(dtype)


def accept_sampled(p: Candidates, q: Candidates | None, drafts: mx.array,
                   key: mx.array) -> tuple[mx.array, mx.array]:
    """``sampling.accept_sampled`` on compact rows (same rule, same use of ``key``):
    ``p`` k+1 target rows, ``q`` k draft rows (None: argmax drafts). Exact when every
    ``p.exact`` holds: p is then zero outside its ids, so the residual max(p - q, 0) is too."""
    k = drafts.shape[0]
    k_u, k_s = sampling.split_key(key, 2)
    if k == 0:
        return mx.array(0, dtype=mx.int32), sample(p.row(0), k_s)[0]
    drafts = drafts.astype(mx.int32)
    pd = prob_of(p.row(slice(0, k)), drafts)
    qd = mx.ones_like(pd) if q is None else prob_of(q, drafts)
    safe = mx.where(qd > 0, qd, mx.ones_like(qd))
    a = mx.where(qd > 0, mx.minimum(pd / safe, mx.ones_like(pd)), (pd > 0).astype(pd.dtype))
    u = mx.random.uniform(shape=(k,), key=k_u).astype(a.dtype)
    n = mx.sum(mx.cumprod((u < a).astype(mx.int32), axis=0)).astype(mx.int32)
    r_i = mx.minimum(n, k - 1).reshape(1)
    row = p.row(r_i)
    qrow = None if q is None else q.row(r_i)
    ids, probs = row.ids[0], row.probs[0]
    r = mx.maximum(probs - _q_on(qrow, ids, mx.take(drafts, r_i)[0], probs.dtype),
                   mx.zeros_like(probs))
    mass = mx.sum(r)
    corr = mx.where(mass > 0, r / mx.where(mass > 0, mass, 1), probs / mx.sum(probs))
    bonus = p.row(k)
    dist = mx.where(n >= k, bonus.probs[0], corr)
    dist_ids = mx.where(n >= k, bonus.ids[0], ids)
    j = sampling.sample(dist[None], k_s)[0]
    return n, mx.take(dist_ids, j)
