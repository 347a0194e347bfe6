"""Exact speculative acceptance, proved by enumeration (MTP_SPEC section 5).

For a toy history-dependent target (random logits per history, penalties over the generated
history, top-k/top-p/min-p) and a toy drafter (random q with zeros, argmax drafts, q == p,
mixtures), every draft sequence is enumerated and weighted by its draft probability; the
accept/reject/correction/bonus outcome probabilities are computed with the very functions
``accept_sampled`` uses (``accept_probs``, ``extra_distribution`` -> ``residual``) and the
verify rows with ``build_probs`` + ``history_counts``. Cycles are chained until ``m`` tokens
are emitted, and the distribution of the first ``m`` emitted tokens must equal the target
process ``prod_j p(s_j | s_<j)`` (numpy float64 reference) to 1e-9.
"""
from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine.sampling import exact as S
from engine.types import SamplingParams
from tests.engine.sampling.test_sampling import ref_probs

F64 = mx.float64


@pytest.fixture(autouse=True)
def _cpu_stream():
    with mx.stream(mx.cpu):
        yield


# --------------------------------------------------------------------------------------
# Toy target and drafters
# --------------------------------------------------------------------------------------


class ToyTarget:
    """p(. | h) = build_probs(logits(h), params, counts of generated history h)."""

    def __init__(self, vocab: int, params: SamplingParams, seed: int) -> None:
        self.vocab, self.params, self.seed = vocab, params, seed
        self._truth: dict[tuple[int, ...], np.ndarray] = {}
        self._logits: dict[tuple[int, ...], np.ndarray] = {}

    def logits(self, h: tuple[int, ...]) -> np.ndarray:
        if h not in self._logits:
            rng = np.random.default_rng([self.seed, len(h), *h])
            self._logits[h] = rng.normal(size=self.vocab) * 1.5
        return self._logits[h]

    def counts(self, h: tuple[int, ...]) -> np.ndarray:
        return np.bincount(np.array(h, dtype=np.int64), minlength=self.vocab).astype(float)

    def truth(self, h: tuple[int, ...]) -> np.ndarray:
        """Plain decoding's distribution, from the independent numpy reference."""
        if h not in self._truth:
            self._truth[h] = ref_probs(self.logits(h)[None], self.params, self.counts(h)[None])[0]
        return self._truth[h]


class ToyDrafter:
    """Draft distributions q(. | h). ``kind``: "random" (with zeros), "argmax"
    (deterministic drafts, q one-hot -> passed as None), "target" (q == p exactly),
    "mixture" (half target, half random with zeros)."""

    def __init__(self, kind: str, target: ToyTarget, seed: int) -> None:
        self.kind, self.target, self.seed = kind, target, seed
        self._q: dict[tuple[int, ...], np.ndarray] = {}

    def q(self, h: tuple[int, ...]) -> np.ndarray:
        if h not in self._q:
            self._q[h] = self._make_q(h)
        return self._q[h]

    def _make_q(self, h: tuple[int, ...]) -> np.ndarray:
        vocab = self.target.vocab
        rng = np.random.default_rng([self.seed, 7, len(h), *h])
        rand = rng.random(vocab) ** 2 * (rng.random(vocab) < 0.6)
        rand[rng.integers(vocab)] += 0.1
        rand /= rand.sum()
        if self.kind == "random":
            return rand
        if self.kind == "target":
            return self.target.truth(h)
        if self.kind == "mixture":
            return 0.5 * self.target.truth(h) + 0.5 * rand
        raise ValueError(self.kind)

    def argmax_draft(self, h: tuple[int, ...]) -> int:
        return int(np.argmax(np.random.default_rng([self.seed, 9, len(h), *h]).normal(
            size=self.target.vocab)))

    def sequences(self, h: tuple[int, ...], k: int):
        """All draft sequences with positive probability, their probabilities and q rows."""
        if self.kind == "argmax":
            seq: tuple[int, ...] = ()
            for _ in range(k):
                seq += (self.argmax_draft(h + seq),)
            return [seq], np.ones(1), None
        seqs, weights, qrows = [], [], []
        for seq in itertools.product(range(self.target.vocab), repeat=k):
            rows = [self.q(h + seq[:i]) for i in range(k)]
            w = float(np.prod([rows[i][seq[i]] for i in range(k)]))
            if w > 0:
                seqs.append(seq)
                weights.append(w)
                qrows.append(rows)
        return seqs, np.array(weights), np.array(qrows)


# --------------------------------------------------------------------------------------
# Enumeration
# --------------------------------------------------------------------------------------


def cycle_outcomes(target, drafter, h, k, *, dtype=F64, accept_probs=S.accept_probs,
                   extra_distribution=S.extra_distribution) -> dict[tuple[int, ...], float]:
    """Probability of each token sequence one speculative cycle at history ``h`` emits."""
    vocab = target.vocab
    seqs, weights, qrows = drafter.sequences(h, k)
    drafts = mx.array(np.array(seqs, dtype=np.int32).reshape(len(seqs), k))
    base = mx.array(target.counts(h), dtype=dtype)
    counts = mx.vmap(S.history_counts, in_axes=(None, 0))(base, drafts)  # [B, k+1, V]
    logits = np.array([[target.logits(h + s[:i]) for i in range(k + 1)] for s in seqs])
    p = S.build_probs(mx.array(logits.reshape(-1, vocab), dtype=dtype), target.params,
                      counts.reshape(-1, vocab)).reshape(len(seqs), k + 1, vocab)
    q = None if qrows is None else mx.array(qrows, dtype=dtype)
    acc = np.array(accept_probs(p[:, :k], q, drafts), dtype=np.float64)  # [B, k]
    out: dict[tuple[int, ...], float] = defaultdict(float)
    for n in range(k + 1):
        nn = mx.array(n, dtype=mx.int32)
        if q is None:
            dist = mx.vmap(lambda pp, dd: extra_distribution(pp, None, dd, nn))(p, drafts)
        else:
            dist = mx.vmap(lambda pp, qq, dd: extra_distribution(pp, qq, dd, nn))(p, q, drafts)
        dist = np.array(dist, dtype=np.float64)
        stop = 1.0 - acc[:, n] if n < k else np.ones(len(seqs))
        w = weights * np.prod(acc[:, :n], axis=1) * stop
        for b, seq in enumerate(seqs):
            if w[b] == 0:
                continue
            for t in np.flatnonzero(dist[b]):
                out[seq[:n] + (int(t),)] += w[b] * dist[b, t]
    return out


def emitted_prefix_distribution(target, drafter, h, k, m, **kw) -> dict[tuple[int, ...], float]:
    """Distribution of the first ``m`` tokens emitted by chained cycles of depth ``k``."""
    memo: dict[tuple[int, ...], dict] = {}

    def outcomes(hist):
        if hist not in memo:
            memo[hist] = cycle_outcomes(target, drafter, hist, k, **kw)
        return memo[hist]

    def prefix(hist, need):
        res: dict[tuple[int, ...], float] = defaultdict(float)
        for seq, w in outcomes(hist).items():
            if len(seq) >= need:
                res[seq[:need]] += w
            else:
                for rest, w2 in prefix(hist + seq, need - len(seq)).items():
                    res[seq + rest] += w * w2
        return res

    return prefix(tuple(h), m)


def target_prefix_distribution(target, h, m) -> dict[tuple[int, ...], float]:
    """prod_j p(s_j | h, s_<j) for every sequence of length m (plain decoding)."""
    out = {}
    for seq in itertools.product(range(target.vocab), repeat=m):
        prob = 1.0
        for j in range(m):
            prob *= target.truth(tuple(h) + seq[:j])[seq[j]]
            if prob == 0:
                break
        out[seq] = prob
    return out


def max_deviation(got: dict, want: dict) -> float:
    keys = set(got) | set(want)
    return max(abs(got.get(s, 0.0) - want.get(s, 0.0)) for s in keys)


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------

PARAMS = {
    "penalties": SamplingParams(temperature=1.0, presence_penalty=0.8, frequency_penalty=0.5),
    "topk_topp_pen": SamplingParams(temperature=0.7, top_k=3, top_p=0.9, presence_penalty=0.6),
    "minp_freq": SamplingParams(temperature=1.2, min_p=0.2, frequency_penalty=1.0),
    "topp": SamplingParams(temperature=0.9, top_p=0.7),
    "topp_minp_pres": SamplingParams(temperature=1.1, top_p=0.85, min_p=0.1, presence_penalty=0.7),
    "greedy_pen": SamplingParams(temperature=0.0, presence_penalty=1.0),
}

CHAIN_CASES = [
    # (vocab, k, m, params, drafter kind)
    (6, 1, 2, "penalties", "random"),
    (5, 2, 3, "penalties", "random"),
    (5, 2, 3, "topk_topp_pen", "random"),
    (5, 2, 3, "minp_freq", "mixture"),
    (4, 3, 4, "topk_topp_pen", "random"),
    (4, 3, 4, "penalties", "argmax"),
    (5, 3, 3, "minp_freq", "argmax"),
    (4, 3, 3, "topk_topp_pen", "target"),
    (5, 2, 3, "greedy_pen", "random"),
    (5, 3, 4, "greedy_pen", "argmax"),
    (5, 3, 4, "penalties", "mixture"),
    (4, 4, 5, "minp_freq", "random"),
    (3, 5, 6, "minp_freq", "random"),
    (3, 6, 4, "penalties", "random"),
    (2, 6, 7, "penalties", "random"),
    (5, 2, 3, "topp", "random"),
    (4, 3, 4, "topp", "argmax"),
    (5, 3, 3, "topp_minp_pres", "mixture"),
]


@pytest.mark.parametrize("vocab,k,m,pname,kind", CHAIN_CASES,
                         ids=[f"V{c[0]}-k{c[1]}-m{c[2]}-{c[3]}-{c[4]}" for c in CHAIN_CASES])
def test_chained_cycles_emit_exactly_the_target_process(vocab, k, m, pname, kind):
    target = ToyTarget(vocab, PARAMS[pname], seed=vocab * 100 + k)
    drafter = ToyDrafter(kind, target, seed=k)
    history = (1,)  # earlier generated token: non-zero base counts
    got = emitted_prefix_distribution(target, drafter, history, k, m)
    want = target_prefix_distribution(target, history, m)
    assert abs(sum(got.values()) - 1.0) < 1e-12
    assert max_deviation(got, want) < 1e-9
    # The case is not degenerate: the target really depends on history and is not flat.
    firsts = {s[:1] for s, w in want.items() if w > 0}
    assert len(firsts) >= (1 if PARAMS[pname].greedy else 2)


def test_single_position_large_vocab_every_draft_distribution():
    """First emitted token == p for a large vocabulary, sampled q with zeros, and for every
    possible deterministic (argmax) draft."""
    rng = np.random.default_rng(4)
    vocab = 60
    params = SamplingParams(temperature=0.9, top_k=25, top_p=0.85, presence_penalty=1.2,
                            frequency_penalty=0.3)
    logits = rng.normal(size=(2, vocab)) * 2
    counts = np.zeros((2, vocab))
    counts[:, rng.integers(vocab, size=10)] = rng.integers(1, 3, size=10)
    p = S.build_probs(mx.array(logits, dtype=F64), params, mx.array(counts, dtype=F64))
    pn = np.array(p)
    want = ref_probs(logits, params, counts)[0]
    assert (pn[0] == 0).sum() > 30 and np.abs(pn[0] - want).max() < 1e-12
    q = rng.random(vocab) * (rng.random(vocab) < 0.5)
    q[0] += 0.01
    q /= q.sum()
    every = mx.arange(vocab, dtype=mx.int32).reshape(vocab, 1)  # one row per draft token
    p_b = mx.broadcast_to(p[None], (vocab, 2, vocab))
    n0 = mx.array(0, dtype=mx.int32)

    # Sampled drafts d ~ q: P(first = t) = sum_d q(d) [a(d) 1(t = d) + (1 - a(d)) r(t)].
    q_b = mx.broadcast_to(mx.array(q, dtype=F64)[None, None], (vocab, 1, vocab))
    acc = np.array(S.accept_probs(p_b[:, :1], q_b, every))[:, 0]
    res = mx.vmap(lambda pp, qq, dd: S.extra_distribution(pp, qq, dd, n0))(p_b, q_b, every)
    per_draft = acc[:, None] * np.eye(vocab) + (1 - acc)[:, None] * np.array(res)
    assert np.abs(q @ per_draft - pn[0]).max() < 1e-12

    # Deterministic (argmax-style) drafts: every single draft token alone already gives p.
    acc = np.array(S.accept_probs(p_b[:, :1], None, every))[:, 0]
    res = mx.vmap(lambda pp, dd: S.extra_distribution(pp, None, dd, n0))(p_b, every)
    per_draft = acc[:, None] * np.eye(vocab) + (1 - acc)[:, None] * np.array(res)
    assert np.abs(per_draft - pn[0][None, :]).max() < 1e-12


def test_float32_pipeline_is_exact_to_float32_precision():
    target = ToyTarget(5, PARAMS["topk_topp_pen"], seed=3)
    drafter = ToyDrafter("random", target, seed=3)
    got = emitted_prefix_distribution(target, drafter, (2,), 2, 3, dtype=mx.float32)
    want = target_prefix_distribution(target, (2,), 3)
    assert max_deviation(got, want) < 1e-5


def _residual_ignoring_q(p, q, drafts, n):
    k = drafts.shape[0]
    return mx.take(p, mx.minimum(n, k), axis=0)


def _greedy_match(p, q, drafts):
    return (drafts == mx.argmax(p, axis=-1)).astype(p.dtype)


@pytest.mark.parametrize("broken", ["extra", "accept"])
def test_enumeration_detects_wrong_acceptance_rules(broken):
    """The enumeration has power: a correction drawn from p instead of the residual, or
    greedy-match acceptance at temperature > 0, is off by far more than the tolerance."""
    target = ToyTarget(5, PARAMS["penalties"], seed=11)
    drafter = ToyDrafter("random", target, seed=2)
    kw = ({"extra_distribution": _residual_ignoring_q} if broken == "extra"
          else {"accept_probs": _greedy_match})
    got = emitted_prefix_distribution(target, drafter, (0,), 2, 2, **kw)
    want = target_prefix_distribution(target, (0,), 2)
    assert abs(sum(got.values()) - 1.0) < 1e-9
    assert max_deviation(got, want) > 1e-3
