"""Exact filtered sampling that never sorts, or draws noise over, the whole vocabulary.

Contract: for a non-greedy ``SamplingParams`` that filters (``applies``), the distribution
plain decoding samples from (``sampling.build_probs``) is supported on a few of the largest
(penalised, temperature-scaled) logits, so everything after one selection runs on ``k``
values. Two cases:

* **top-k** (``0 < top_k <= MAX_K``, with or without top-p/min-p): the support is the
  ``top_k`` largest logits.

  1. penalties and temperature on the raw logits (two cheap elementwise passes, as
     ``sampling.build_probs`` does them);
  2. the exact top ``k`` by value (:func:`top_k`): the vocabulary is cut into blocks of
     ``BLOCK``, the ``k`` blocks with the largest maxima are kept (they hold the top ``k``: see
     :func:`top_k`), and ``argpartition`` runs on those ``k·BLOCK`` values only;
  3. softmax over the ``k`` values, top-p over their descending order (the same cut-off rule
     as ``sampling``: the smallest prefix with mass >= ``top_p``, ties with the cut-off kept),
     min-p, renormalise — all on ``[R, k]``.

  ``exact`` says that no token outside the ``k`` selected ties the ``k``-th value.

* **nucleus** (top-p and/or min-p without top-k, e.g. Qwen's 0.6 / 0.95 / 0): the support
  is the whole vocabulary, so top-p needs the row's normaliser ``Z``, and exponentiating the
  whole row costs ~4 ms at V = 248,320 on a CPU. :func:`_nucleus` takes the
  ``NUCLEUS_BLOCKS`` blocks with the largest maxima (their values are exponentiated one by
  one), bounds every other block by ``BLOCK·exp(its max)``, and keeps the ``NUCLEUS_K + 1``
  largest logits as candidates. The cut-off is decided only where it is certain: for every
  ``Z`` within those bounds, and for every value ``build_probs``' own float32 sum over the
  vocabulary can take (it drops terms below half an ulp of its running sum: measured 0.16%
  of ``Z`` on one row; bounded here by ``sum(min(e_i, 2^-24 Z))``). min-p needs no ``Z``: it
  keeps ``logit >= max + log(min_p)``. ``exact`` is False when the top-p cut-off lies
  beyond the candidates or too close to call (rows whose tail outside the selected blocks
  holds more than ~1e-4 of the mass often are), when a token beyond the candidates would be
  kept, or when a logit lies within ``LOGIT_GAP`` of the threshold (float32 rounding could
  decide either way there).

Where ``Candidates.exact`` [R] is False the caller must use the dense path
(``sampling.build_probs``) for that target row: ``engine.decoding.acceptance`` and ``engine.decoding.draw`` check
it at their one host synchronisation and redo that step densely. A *draft* needs no check:
any q is exact as long as the draft was sampled from it, and a draft sampled from
``Candidates`` is (an inexact row is still a normalised distribution on its ids).

Where ``exact``, the kept token set equals ``build_probs``' and the probabilities equal its
up to float32 rounding (they are renormalised over the kept set from a different sum; not
bit for bit). Selection by block maxima, by ``argpartition`` on the whole row, and by a full
sort give the same values in the same order (tested bit for bit at V = 248,320 with ties),
and the probabilities are computed from those values by one function, so they are
bit-identical too.

Lazy MLX only, like ``engine.sampling.exact``: no host synchronisation here.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mlx.core as mx

from engine.sampling import exact as sampling
from engine.types import SamplingParams

BLOCK = 16        # vocabulary block for the two-stage selection
MAX_K = 256       # larger top-k values use the dense path
DIRECT_V = 4096   # below this vocabulary size, argpartition the whole row
NUCLEUS_K = 128          # candidates for top-p / min-p without top-k
NUCLEUS_BLOCKS = 2048    # blocks whose exp enters the normaliser one by one (nucleus)
LOGIT_GAP = 1e-4         # closer logits may compare either way as float32 probabilities
MASS_SLACK = 3e-5        # relative error of float32 cumulative masses of <= NUCLEUS_K + 1 terms
MIN_LOGIT = -60.0        # thresholds further below the max logit: dense path
_U = 2.0 ** -24          # float32 unit roundoff
_LOG2E = 1.0 / math.log(2.0)
_EXP_ERR = 2e-5           # relative error of one term of the normaliser, ours or build_probs'


def applies(params: SamplingParams, vocab: int, dtype=mx.float32) -> bool:
    """Whether the compact path computes ``params``' distribution (float32 logits only)."""
    if params.greedy or dtype == mx.float64:
        return False
    if 0 < params.top_k < vocab:
        return params.top_k <= MAX_K
    return params.top_p < 1.0 or params.min_p > 0.0


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
        """The same distribution as ``[R, V]`` (zeros outside ``ids``; a scatter-add, which
        costs ~0.1 ms where comparing ids with the vocabulary cost ~40 ms per 20 ids)."""
        R, k = self.ids.shape
        rows = mx.broadcast_to(mx.arange(R)[:, None], (R, k))
        return mx.zeros((R, vocab), dtype=self.probs.dtype).at[rows, self.ids].add(self.probs)


def _penalised(logits: mx.array, params: SamplingParams, counts: mx.array | None = None):
    return sampling.apply_penalties(logits, counts, presence=params.presence_penalty,
                                    frequency=params.frequency_penalty)


def scaled_logits(logits: mx.array, params: SamplingParams, counts: mx.array | None = None):
    """Penalties then temperature, exactly as ``sampling.build_probs`` applies them."""
    x = _penalised(logits, params, counts)
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
    p = sampling.softmax(vals)
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
    """The compact form of ``sampling.build_probs(logits, params, counts)`` (see ``applies``).
    ``method`` chooses the top-k selection (:func:`top_k`); the nucleus case has its own."""
    if not 0 < params.top_k < logits.shape[-1]:
        return _nucleus(_penalised(logits, params, counts), params)
    x = scaled_logits(logits, params, counts)
    k = params.top_k
    vals, ids = top_k(x, k, method=method)
    exact = mx.sum(x >= vals[:, k - 1:k], axis=-1) == k
    return Candidates(ids=ids, probs=filter_probs(vals, params), exact=exact)


def _block_max(x: mx.array) -> tuple[mx.array, mx.array]:
    """``x`` padded with -inf to whole blocks, and its block maxima [R, nb]."""
    R, V = x.shape
    if V % BLOCK:
        x = mx.concatenate([x, mx.full((R, -V % BLOCK), -math.inf, dtype=x.dtype)], axis=-1)
    return x, mx.max(x.reshape(R, -1, BLOCK), axis=-1)


def _block_values(x: mx.array, blocks: mx.array) -> tuple[mx.array, mx.array]:
    """The values [R, n·BLOCK] of ``blocks`` [R, n] (int32) and their ids."""
    ids = (mx.expand_dims(blocks * BLOCK, -1) + mx.arange(BLOCK, dtype=mx.int32))
    ids = ids.reshape(x.shape[0], -1)
    return mx.take_along_axis(x, ids, axis=-1), ids


def _nucleus_select(x: mx.array, k1: int) -> tuple[mx.array, ...]:
    """The ``k1`` largest values of each row, descending [R, k1], their ids, the values
    whose exp enters the normaliser one by one (the ``NUCLEUS_BLOCKS`` blocks with the
    largest maxima, or the whole row if small) and the maxima of the other blocks (-inf if
    none). Blocks hold the largest values as in :func:`top_k`."""
    R, V = x.shape
    if V <= NUCLEUS_BLOCKS * BLOCK:
        k1 = min(k1, V)
        idx = mx.argpartition(x, V - k1, axis=-1)[:, V - k1:].astype(mx.int32)
        return (*_descending(x, idx), x, mx.full((R, 1), -math.inf, dtype=x.dtype))
    xp, bmax = _block_max(x)
    nb, n = bmax.shape[-1], NUCLEUS_BLOCKS
    part = mx.argpartition(bmax, nb - n, axis=-1)
    blocks = part[:, nb - n:].astype(mx.int32)
    rest = mx.take_along_axis(bmax, part[:, :nb - n], axis=-1)
    zvals, _ = _block_values(xp, blocks)
    best = mx.argpartition(mx.take_along_axis(bmax, blocks, axis=-1), n - k1, axis=-1)
    vals, ids = _block_values(xp, mx.take_along_axis(blocks, best[:, n - k1:], axis=-1))
    pick = mx.argpartition(vals, k1 * BLOCK - k1, axis=-1)[:, k1 * BLOCK - k1:]
    top, ids = _descending(xp, mx.take_along_axis(ids, pick, axis=-1))
    return top, mx.minimum(ids, V - 1), zvals, rest


def _z_bounds(m: mx.array, vals: mx.array, rest: mx.array,
              temperature: float) -> tuple[mx.array, mx.array]:
    """Bounds [R, 1] on the float32 normaliser ``build_probs`` sums over the whole row, from
    the penalised logits before temperature: the row max ``m``, the selected ``vals`` (each
    exponentiated) and the maxima ``rest`` of the other blocks. The exact sum lies in
    [S, S + T], T = BLOCK·sum(exp((rest - m) / temperature)). A float32 sum of positive terms
    is off by at most sum(min(e_i, u·Z)) (an addition is off by at most half an ulp of its
    result and by at most its smaller term) plus u·Z per level of a final tree over lanes:
    so is ours (S), and so is build_probs' (whose other terms add <= T). ``power(2, ·)`` is
    ~3x cheaper than ``exp`` here; with the rounding of its argument, within 2e-5 of e^x."""
    c = _LOG2E / temperature
    e = mx.power(2.0, (vals - m) * c)
    s = mx.sum(e, axis=-1, keepdims=True)
    t = BLOCK * mx.sum(mx.power(2.0, (rest - m) * c), axis=-1, keepdims=True) * 1.002
    z = (s + t) * (1 + _EXP_ERR)
    err = mx.sum(mx.minimum(e, 2 * _U * z), axis=-1, keepdims=True) + (32 * _U + _EXP_ERR) * z
    return s - 2 * err - t, s + 2 * err + 2 * t


def _threshold(d: mx.array, e: mx.array, params: SamplingParams, bounds) -> tuple:
    """The lowest kept logit - max [R, 1], and whether ``build_probs`` certainly keeps exactly
    the candidates at or above it [R, 1] (tokens beyond the candidates aside). ``d`` [R, k+1]:
    descending candidates' logits - max, ``e`` = exp(d); ``bounds``: :func:`_z_bounds`."""
    inf = mx.array(math.inf, dtype=d.dtype)
    theta, ok = -inf, mx.ones((d.shape[0], 1), dtype=mx.bool_)
    if params.top_p < 1.0:
        before = mx.cumsum(e, axis=-1, inclusive=False)  # build_probs' mass of larger ones
        keep = before * (1 + MASS_SLACK) < params.top_p * bounds[0]  # in its prefix for any Z
        drop = before * (1 - MASS_SLACK) >= params.top_p * bounds[1]  # beyond it for any Z
        n_keep = mx.sum(keep, axis=-1, keepdims=True)
        cut = mx.take_along_axis(d, mx.maximum(n_keep - 1, 0).astype(mx.int32), axis=-1)
        sure = mx.all(keep | drop, axis=-1, keepdims=True) & mx.any(drop, axis=-1, keepdims=True)
        theta = mx.where(sure, cut, -inf)
        near = (d != cut) & (mx.abs(d - cut) < LOGIT_GAP)  # might sort either side of the cut
        ok = sure & ~mx.any(near, axis=-1, keepdims=True)
    if params.min_p > 0.0:
        log_min = math.log(params.min_p)  # p >= min_p·max(p)  <=>  logit - max >= log(min_p)
        if params.top_p < 1.0:  # or the min-p set lies inside the certain top-p prefix
            ok = ok | (mx.sum(d >= log_min, axis=-1, keepdims=True) <= n_keep)
        ok = ok & ~mx.any(mx.abs(d - log_min) < LOGIT_GAP, axis=-1, keepdims=True)
        theta = mx.maximum(theta, log_min)
    return theta, ok


def _nucleus(x: mx.array, params: SamplingParams) -> Candidates:
    """top-p and/or min-p over the whole vocabulary on ``NUCLEUS_K`` candidates (module
    docstring): ``exact`` where the kept set certainly equals ``build_probs``'. ``x``: the
    penalised logits; only what is selected is divided by the temperature (an order-keeping
    map, so the selection is the same), exactly as ``build_probs`` divides the whole row."""
    raw, ids, zvals, rest = _nucleus_select(x, NUCLEUS_K + 1)
    top = raw / params.temperature if params.temperature != 1.0 else raw
    k = min(NUCLEUS_K, top.shape[-1])
    d = top - top[:, :1]  # [R, k + 1] descending, <= 0
    if d.shape[-1] == k:  # every value is a candidate: nothing lies beyond them
        d = mx.concatenate([d, mx.full((d.shape[0], 1), -math.inf, dtype=d.dtype)], axis=-1)
    e = mx.exp(d)
    bounds = None
    if params.top_p < 1.0:
        bounds = _z_bounds(raw[:, :1], zvals, rest, params.temperature)
    theta, ok = _threshold(d, e, params, bounds)
    exact = ok & (d[:, k:k + 1] < theta - LOGIT_GAP) & (theta > MIN_LOGIT)
    p = mx.where(d[:, :k] >= theta, e[:, :k], mx.zeros_like(e[:, :k]))
    return Candidates(ids=ids[:, :k], probs=p / mx.sum(p, axis=-1, keepdims=True),
                      exact=exact[:, 0])


def sample(c: Candidates, key: mx.array) -> mx.array:
    """One draw per row -> [R] int32 token ids (Gumbel-max over the k probabilities)."""
    j = sampling.sample(c.probs, key)
    return mx.take_along_axis(c.ids, j[:, None], axis=-1)[:, 0]


def sample_each(c: Candidates, keys: mx.array) -> mx.array:
    """``sample`` of each row with its own key (``keys[R, 2]``) -> [R] token ids."""
    j = sampling.sample_each(c.probs, keys)
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


# -- compiled entry points, one per parameter set ---------------------------------------------
# The same operations as ``build`` + ``sample`` / ``accept_sampled``, fused by ``mx.compile``
# (the same values bit for bit: tested), without the dispatch of ~40-80 small operations a
# draft step or an acceptance that dominated a speculative cycle at temperature > 0 on small
# models. Shapes (the depth, the vocabulary) retrace; parameters are part of the cache key.

@functools.lru_cache(maxsize=64)
def compiled_draft(params: SamplingParams, penalised: bool):
    """(logits [1, V], key[, counts [1, V]]) -> (token [1], ids, probs, exact): one draft
    sampled from ``build``'s candidates, and those candidates (its q row)."""
    def draw(logits, key, counts=None):
        c = build(logits, params, counts)
        return sample(c, key), c.ids, c.probs, c.exact
    return mx.compile(draw if penalised else (lambda logits, key: draw(logits, key)))


@functools.lru_cache(maxsize=64)
def compiled_draft_rows(params: SamplingParams):
    """(logits [R, V], keys [R, 2]) -> (tokens [R], ids, probs, exact): ``compiled_draft``
    for R rows that share ``params`` (no penalties) in one call; row i draws with ``keys[i]``
    exactly what ``compiled_draft`` draws from ``logits[i:i + 1]`` (tested)."""
    def draw(logits, keys):
        c = build(logits, params)
        return sample_each(c, keys), c.ids, c.probs, c.exact
    return mx.compile(draw)


@functools.lru_cache(maxsize=64)
def compiled_accept(params: SamplingParams, penalised: bool, onehot: bool):
    """(logits [k+1, V], drafts [k], key[, q ids, q probs, q exact][, counts rows]) ->
    (n, extra, every target row exact): ``accept_sampled`` on ``build``'s rows. ``onehot``:
    the drafts were argmax or replayed (no q)."""
    def acc(logits, drafts, key, q=None, rows=None):
        p = build(logits, params, rows)
        n, extra = accept_sampled(p, None if q is None else Candidates(*q), drafts, key)
        return n, extra, mx.all(p.exact)
    if onehot:
        return mx.compile((lambda lg, d, k, rows: acc(lg, d, k, None, rows)) if penalised
                          else (lambda lg, d, k: acc(lg, d, k)))
    if penalised:
        return mx.compile(lambda lg, d, k, qi, qp, qe, rows: acc(lg, d, k, (qi, qp, qe), rows))
    return mx.compile(lambda lg, d, k, qi, qp, qe: acc(lg, d, k, (qi, qp, qe)))


@functools.lru_cache(maxsize=64)
def compiled_accept_rows(params: SamplingParams):
    """(logits [R, k+1, V], drafts [R, k], keys [R, 2], q ids, q probs [R, k, K], q exact
    [R, k]) -> (n [R], extra [R], exact [R]): ``compiled_accept`` for R rows of one depth
    k >= 1 that share ``params`` (no penalties), in one call; row i with ``keys[i]`` gets
    exactly what it gets alone (tested). The target rows are built together; the rows'
    acceptances run as one ``vmap`` of ``accept_sampled`` (the same operations, batched: at 8
    rows ~40 % cheaper on the CPU than one copy of them per row)."""
    def one(p_ids, p_probs, p_exact, drafts, key, q_ids, q_probs, q_exact):
        return accept_sampled(Candidates(p_ids, p_probs, p_exact),
                              Candidates(q_ids, q_probs, q_exact), drafts, key)

    def acc(logits, drafts, keys, qi, qp, qe):
        R, S, V = logits.shape
        p = build(logits.reshape(R * S, V), params)
        K = p.ids.shape[-1]
        exact = p.exact.reshape(R, S)
        ns, extras = mx.vmap(one)(p.ids.reshape(R, S, K), p.probs.reshape(R, S, K), exact,
                                  drafts, keys, qi, qp, qe)
        return ns, extras, mx.all(exact, axis=1)
    return mx.compile(acc)


def accept_compiled(logits: mx.array, params: SamplingParams, rows: mx.array | None,
                    q: Candidates | None, drafts: mx.array, key: mx.array) -> tuple:
    """``compiled_accept`` called with the right arguments -> (n, extra, all exact)."""
    f = compiled_accept(params, rows is not None, q is None)
    args = (logits, drafts, key) + (() if q is None else (q.ids, q.probs, q.exact)) + \
        (() if rows is None else (rows,))
    return f(*args)
