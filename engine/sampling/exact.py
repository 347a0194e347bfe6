"""Sampling and exact speculative acceptance on MLX arrays.

Everything here is lazy MLX: no function calls ``.item()``, ``.tolist()``, ``np.array`` or
``mx.eval``, so the decode loop can build a whole cycle and synchronise once. Python-level
branches look only at shapes and at :class:`~engine.types.SamplingParams` (plain floats),
never at array contents.

Dtypes: ``float32`` and ``float64`` inputs keep their dtype (``float64`` needs the CPU
stream); ``float16``/``bfloat16`` logits are promoted to ``float32`` first. Random numbers are
drawn in ``float32`` and cast, so a ``float64`` pipeline is exact in its arithmetic but its
random draws have 24-bit granularity.

Tie handling (deterministic, independent of sort order, identical for a batched verify row
and a one-token decode step with equal logits):

* greedy / argmax: the lowest token id among equal maxima wins (``mx.argmax`` semantics);
* top-k: every token whose logit equals the k-th largest is kept (may keep more than k);
* top-p: the cut-off probability is that of the last token of the smallest descending-sorted
  prefix with mass >= ``top_p``; every token with probability >= that value is kept;
* min-p: tokens with ``p >= min_p * max(p)`` are kept (equality kept).

Exact acceptance follows Leviathan et al. / Chen et al. (MTP_SPEC section 5). The maths is
factored into :func:`accept_probs`, :func:`residual` and :func:`extra_distribution`, which
broadcast over leading batch dimensions; :func:`accept_sampled` uses exactly those, and the
tests enumerate outcomes with the same functions.
"""
from __future__ import annotations

import math

import mlx.core as mx

from engine.types import SamplingParams

__all__ = [
    "KeyStream",
    "accept_greedy",
    "accept_probs",
    "accept_sampled",
    "add_counts",
    "apply_penalties",
    "argmax_tokens",
    "build_probs",
    "extra_distribution",
    "history_counts",
    "make_key",
    "residual",
    "sample",
    "split_key",
]

_FLOATS = (mx.float32, mx.float64)


def _as_float(x: mx.array) -> mx.array:
    """``x`` in float32 or float64 (half precisions are promoted to float32)."""
    return x if x.dtype in _FLOATS else x.astype(mx.float32)


# --------------------------------------------------------------------------------------
# Random keys
# --------------------------------------------------------------------------------------


def make_key(seed: int) -> mx.array:
    """An explicit MLX PRNG key for ``seed`` (any non-negative Python int)."""
    return mx.random.key(int(seed) & 0xFFFFFFFFFFFFFFFF)


def split_key(key: mx.array, num: int = 2) -> list[mx.array]:
    """Split ``key`` into ``num`` independent keys (lazy, no sync)."""
    keys = mx.random.split(key, num)
    return [keys[i] for i in range(num)]


class KeyStream:
    """A reproducible sequence of keys: ``KeyStream(seed).next()`` once per random draw.

    Two streams built from the same seed yield the same keys in the same order, so a
    generation is reproducible as long as the caller draws keys in a fixed order.
    """

    def __init__(self, seed: int) -> None:
        self._key = make_key(seed)

    def next(self) -> mx.array:
        """The next key (advances the stream)."""
        self._key, sub = split_key(self._key, 2)
        return sub


# --------------------------------------------------------------------------------------
# Penalties and history
# --------------------------------------------------------------------------------------


def apply_penalties(
    logits: mx.array, counts: mx.array | None, *, presence: float, frequency: float
) -> mx.array:
    """OpenAI penalties: ``logit - presence * (count > 0) - frequency * count``.

    ``counts[R, V]`` (any numeric dtype, broadcastable to ``logits``) counts each token in the
    *generated* history of that row (prompt tokens excluded; earlier drafts of the same
    cycle included, see :func:`history_counts`). ``None`` or zero penalties return
    ``logits`` unchanged (promoted to float32 if half precision).
    """
    logits = _as_float(logits)
    if counts is None or (presence == 0.0 and frequency == 0.0):
        return logits
    c = counts.astype(logits.dtype)
    out = logits
    if presence != 0.0:
        out = out - presence * (c > 0).astype(logits.dtype)
    if frequency != 0.0:
        out = out - frequency * c
    return out


def add_counts(counts: mx.array, tokens: mx.array) -> mx.array:
    """``counts[V]`` plus the one-hot counts of ``tokens[n]`` (repeats counted)."""
    if tokens.size == 0:
        return counts
    vocab = counts.shape[-1]
    hits = (tokens.reshape(-1, 1) == mx.arange(vocab)).astype(counts.dtype)
    return counts + hits.sum(axis=0)


def history_counts(base_counts: mx.array, drafts: mx.array) -> mx.array:
    """Per-verify-row counts: ``[k+1, V]``, row ``i`` = base + counts of ``d_1 .. d_i``.

    Row 0 (the distribution of the first draft position) sees only ``base_counts``; row
    ``i`` also sees the first ``i`` drafts, exactly what plain decoding would have counted
    had those drafts been committed. Result dtype is ``base_counts.dtype``.
    """
    vocab = base_counts.shape[-1]
    k = drafts.shape[0]
    base = base_counts.reshape(1, vocab)
    if k == 0:
        return base
    onehot = (drafts.reshape(k, 1) == mx.arange(vocab)).astype(base_counts.dtype)
    prefix = mx.cumsum(onehot, axis=0)
    zero = mx.zeros((1, vocab), dtype=base_counts.dtype)
    return base + mx.concatenate([zero, prefix], axis=0)


# --------------------------------------------------------------------------------------
# Target distribution (exactly what plain decoding samples from)
# --------------------------------------------------------------------------------------


def argmax_tokens(logits: mx.array, params: SamplingParams, counts: mx.array | None = None):
    """Greedy choice per row: argmax of the penalised logits (lowest id wins ties), int32."""
    x = apply_penalties(
        logits, counts, presence=params.presence_penalty, frequency=params.frequency_penalty
    )
    return mx.argmax(x, axis=-1).astype(mx.int32)


def softmax(x: mx.array) -> mx.array:
    """Softmax over the last axis; -inf logits get exactly 0.

    MLX 0.32's CPU ``exp`` is only float32-accurate even for float64 inputs, so float64
    uses ``power(e, x)`` (accurate to ~1e-15); float32 uses MLX's own softmax.
    """
    if x.dtype != mx.float64:
        return mx.softmax(x, axis=-1, precise=True)
    e = mx.power(mx.array(math.e, dtype=mx.float64), x - mx.max(x, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)


def _one_hot(index: mx.array, vocab: int, dtype) -> mx.array:
    return (mx.expand_dims(index, -1) == mx.arange(vocab)).astype(dtype)


def _top_k_mask(x: mx.array, k: int) -> mx.array:
    """Keep logits >= the k-th largest (ties at the boundary kept); others -> -inf."""
    vocab = x.shape[-1]
    kth = mx.partition(x, vocab - k, axis=-1)[..., vocab - k : vocab - k + 1]
    return mx.where(x >= kth, x, mx.array(-float("inf"), dtype=x.dtype))


def _top_p_filter(p: mx.array, top_p: float, support: int = 0) -> mx.array:
    """Zero all but the smallest high-probability set with mass >= top_p (ties kept).

    ``support > 0`` promises that at most ``support`` entries per row are non-zero apart
    from ties with the ``support``-th largest (true after top-k); only the ``support``
    largest values are then sorted, which gives the same cut-off as a full sort.
    """
    vocab = p.shape[-1]
    if 0 < support < vocab:
        s = mx.sort(mx.topk(p, support, axis=-1), axis=-1)  # ascending, exact values of p
    else:
        s = mx.sort(p, axis=-1)  # ascending
    # Mass of strictly-earlier tokens in descending order = reverse exclusive cumsum.
    before = mx.cumsum(s, axis=-1, reverse=True, inclusive=False)
    keep = before < top_p
    inf = mx.array(float("inf"), dtype=p.dtype)
    cutoff = mx.min(mx.where(keep, s, inf), axis=-1, keepdims=True)
    return mx.where(p >= cutoff, p, mx.zeros_like(p))


def build_probs(
    logits: mx.array, params: SamplingParams, counts: mx.array | None = None
) -> mx.array:
    """The distribution plain decoding samples from, one row per ``logits`` row.

    Pipeline: penalties on raw logits (:func:`apply_penalties`) -> greedy one-hot if
    ``temperature == 0`` -> divide by temperature -> top-k on logits -> softmax -> top-p ->
    min-p -> renormalise. Disabled filters (``top_k == 0`` or ``>= V``, ``top_p == 1``,
    ``min_p == 0``) are skipped. Every row keeps at least one token (the maximum). See the
    module docstring for tie handling. Returns ``[R, V]`` in float32 or float64.
    """
    x = apply_penalties(
        logits, counts, presence=params.presence_penalty, frequency=params.frequency_penalty
    )
    vocab = x.shape[-1]
    if params.greedy:
        return _one_hot(mx.argmax(x, axis=-1), vocab, x.dtype)
    if params.temperature != 1.0:
        x = x / params.temperature
    support = params.top_k if 0 < params.top_k < vocab else 0
    if support:
        x = _top_k_mask(x, support)
    p = softmax(x)
    filtered = False
    if params.top_p < 1.0:
        p = _top_p_filter(p, params.top_p, support)
        filtered = True
    if params.min_p > 0.0:
        floor = params.min_p * mx.max(p, axis=-1, keepdims=True)
        p = mx.where(p >= floor, p, mx.zeros_like(p))
        filtered = True
    if filtered:
        p = p / mx.sum(p, axis=-1, keepdims=True)
    return p


# --------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """One categorical draw per row of ``probs[R, V]`` (need not be normalised) -> ``[R]`` int32.

    Gumbel-max: ``argmax(log p + G)``; a zero-probability token is never drawn (its score
    is -inf). A one-hot row always yields its hot token.
    """
    probs = _as_float(probs)
    g = mx.random.gumbel(shape=probs.shape, key=key).astype(probs.dtype)
    return mx.argmax(mx.log(probs) + g, axis=-1).astype(mx.int32)


def sample_each(probs: mx.array, keys: mx.array) -> mx.array:
    """``sample`` of each row of ``probs[R, V]`` with its own key (``keys[R, 2]``): row i
    draws exactly what ``sample(probs[i:i + 1], keys[i])`` draws (the same noise)."""
    probs = _as_float(probs)
    V = probs.shape[-1]  # one draw of V noises per key, batched by ``vmap`` (the same bits)
    g = mx.vmap(lambda k: mx.random.gumbel(shape=(V,), key=k))(keys).astype(probs.dtype)
    return mx.argmax(mx.log(probs) + g, axis=-1).astype(mx.int32)


# --------------------------------------------------------------------------------------
# Exact speculative acceptance
# --------------------------------------------------------------------------------------


def _draft_q(q: mx.array | None, drafts: mx.array, dtype) -> mx.array:
    """``q_i(d_i)``, broadcast over leading dims; argmax drafts (q None) have q = 1."""
    if q is None:
        return mx.ones(drafts.shape, dtype=dtype)
    return mx.take_along_axis(q, mx.expand_dims(drafts, -1), axis=-1).squeeze(-1)


def accept_probs(p: mx.array, q: mx.array | None, drafts: mx.array) -> mx.array:
    """Acceptance probability ``min(1, p_i(d_i) / q_i(d_i))`` for each draft position.

    ``p[..., k, V]`` are the target rows for the k draft positions (verify rows 0..k-1),
    ``q[..., k, V]`` the distributions the drafts were drawn from (``None`` = argmax
    drafts, q one-hot), ``drafts[..., k]``. If ``q_i(d_i) == 0`` (the draft could not have
    come from q) the limit is used: accept iff ``p_i(d_i) > 0``. Returns ``[..., k]``.
    """
    p = _as_float(p)
    pd = mx.take_along_axis(p, mx.expand_dims(drafts, -1), axis=-1).squeeze(-1)
    qd = _draft_q(q, drafts, p.dtype)
    safe = mx.where(qd > 0, qd, mx.ones_like(qd))
    ratio = mx.minimum(pd / safe, mx.ones_like(pd))
    return mx.where(qd > 0, ratio, (pd > 0).astype(p.dtype))


def residual(p: mx.array, q: mx.array | None, drafts: mx.array | None = None) -> mx.array:
    """Correction distribution after rejecting a draft: ``normalize(max(p - q, 0))``.

    Broadcasts over leading dims: ``p[..., V]``, ``q[..., V]`` (or ``None`` with
    ``drafts[...]``, meaning q is the one-hot of the draft). Where the residual has no
    positive mass (only possible when the draft would always have been accepted) it
    falls back to ``p`` (normalised). Returns a normalised ``[..., V]``.
    """
    p = _as_float(p)
    if q is None:
        if drafts is None:
            raise ValueError("residual needs drafts when q is None")
        q = _one_hot(drafts, p.shape[-1], p.dtype)
    r = mx.maximum(p - q.astype(p.dtype), mx.zeros_like(p))
    mass = mx.sum(r, axis=-1, keepdims=True)
    pmass = mx.sum(p, axis=-1, keepdims=True)
    return mx.where(mass > 0, r / mx.where(mass > 0, mass, 1), p / pmass)


def extra_distribution(
    p: mx.array, q: mx.array | None, drafts: mx.array, n_accepted: mx.array
) -> mx.array:
    """Distribution of the token emitted after ``n_accepted`` accepted drafts: ``[V]``.

    ``n < k``: the residual of row ``n`` (correction); ``n == k``: target row ``k`` (bonus).
    ``p[k+1, V]``, ``q[k, V] | None``, ``drafts[k]``, ``n_accepted`` an int scalar array.
    """
    p = _as_float(p)
    k = drafts.shape[0]
    if k == 0:
        return p[0] / mx.sum(p[0])
    n = n_accepted.astype(mx.int32)
    row = mx.minimum(n, k - 1)
    p_row = mx.take(p, row, axis=0)
    q_row = None if q is None else mx.take(q, row, axis=0)
    d_row = mx.take(drafts, row, axis=0)
    corr = residual(p_row, q_row, d_row)
    bonus = mx.take(p, mx.array(k, dtype=mx.int32), axis=0)
    return mx.where(n >= k, bonus / mx.sum(bonus), corr)


def accept_sampled(
    p: mx.array, q: mx.array | None, drafts: mx.array, key: mx.array
) -> tuple[mx.array, mx.array]:
    """Exact speculative rejection sampling over one cycle.

    ``p[k+1, V]``: target rows from the verify forward (row i conditions on ``d_1..d_i``),
    built with :func:`build_probs`. ``q[k, V]``: what each draft was sampled from
    (``None`` for argmax drafts). ``drafts[k]`` int. Draft ``d_i`` is accepted with
    probability :func:`accept_probs`, in order; at the first rejection the next token is
    drawn from :func:`residual` of that row, and if all ``k`` are accepted a bonus token is
    drawn from row ``k``. Returns ``(n_accepted, next_token)``, int32 scalars; the cycle
    emits ``drafts[:n_accepted]`` then ``next_token``. The emitted tokens are distributed
    exactly as plain sampling from the target would give them.
    """
    k = drafts.shape[0]
    k_u, k_s = split_key(key, 2)
    if k == 0:
        return mx.array(0, dtype=mx.int32), sample(p[:1], k_s)[0]
    drafts = drafts.astype(mx.int32)
    a = accept_probs(p[:k], q, drafts)
    u = mx.random.uniform(shape=(k,), key=k_u).astype(a.dtype)
    ok = (u < a).astype(mx.int32)
    n = mx.sum(mx.cumprod(ok, axis=0)).astype(mx.int32)
    dist = extra_distribution(p, q, drafts, n)
    nxt = sample(dist[None, :], k_s)[0]
    return n, nxt


def accept_greedy(target_argmax: mx.array, drafts: mx.array) -> tuple[mx.array, mx.array]:
    """Greedy verification: accept while ``d_i == argmax_i``.

    ``target_argmax[k+1]`` (argmax of each verify row), ``drafts[k]``. Returns
    ``(n_accepted, next_token)`` int32 scalars: ``next_token = target_argmax[n_accepted]`` —
    the correction at the first mismatch, or the bonus from row ``k``.
    """
    t = target_argmax.astype(mx.int32)
    k = drafts.shape[0]
    if k == 0:
        return mx.array(0, dtype=mx.int32), t[0]
    match = (drafts.astype(mx.int32) == t[:k]).astype(mx.int32)
    n = mx.sum(mx.cumprod(match, axis=0)).astype(mx.int32)
    return n, mx.take(t, n, axis=0)
