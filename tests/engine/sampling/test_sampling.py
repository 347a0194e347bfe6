"""engine.sampling.exact: target distributions against a numpy float64 reference, sampling,
Monte Carlo checks of exact speculative acceptance, greedy acceptance edge cases.

The exact-enumeration proofs of the acceptance maths live in test_acceptance_enumeration.py.
The numpy helpers here (``ref_probs``, ``chi_square_p``) are reused there.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine.decoding.verify import chi2_sf
from engine.sampling import exact as S
from engine.types import SamplingParams

F64 = mx.float64


@pytest.fixture(autouse=True)
def _cpu_stream():
    # float64 exists only on the CPU stream (on macOS the default device is the GPU).
    with mx.stream(mx.cpu):
        yield


# --------------------------------------------------------------------------------------
# numpy float64 references
# --------------------------------------------------------------------------------------


def ref_probs(logits, params: SamplingParams, counts=None) -> np.ndarray:
    """Straightforward per-row float64 implementation of build_probs' documented contract."""
    logits = np.asarray(logits, dtype=np.float64)
    out = np.zeros_like(logits)
    for r, row in enumerate(logits):
        x = row.copy()
        if counts is not None:
            c = np.asarray(counts[r], dtype=np.float64)
            x = x - params.presence_penalty * (c > 0) - params.frequency_penalty * c
        if params.temperature == 0:
            out[r, int(np.argmax(x))] = 1.0  # np.argmax: first maximum
            continue
        x = x / params.temperature
        if 0 < params.top_k < x.size:
            kth = np.sort(x)[::-1][params.top_k - 1]
            x = np.where(x >= kth, x, -np.inf)
        p = np.exp(x - x.max())
        p /= p.sum()
        if params.top_p < 1.0:
            cum, cutoff = 0.0, None
            for v in np.sort(p)[::-1]:
                cum += v
                if cum >= params.top_p:
                    cutoff = v
                    break
            if cutoff is not None:
                p = np.where(p >= cutoff, p, 0.0)
        if params.min_p > 0:
            p = np.where(p >= params.min_p * p.max(), p, 0.0)
        out[r] = p / p.sum()
    return out


def chi_square_p(observed, probs, *, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of integer ``observed`` counts against ``probs``.

    Asserts that nothing was observed where ``probs`` is zero. Cells with expected count
    below ``min_expected`` are pooled into one cell.
    """
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    assert observed[probs == 0].sum() == 0, "observed a zero-probability outcome"
    n = observed.sum()
    expected = probs * n
    big = expected >= min_expected
    obs = list(observed[big])
    exp = list(expected[big])
    small_e = expected[~big & (probs > 0)].sum()
    if small_e > 0:
        obs.append(observed[~big & (probs > 0)].sum())
        exp.append(small_e)
    obs, exp = np.array(obs), np.array(exp)
    stat = float(((obs - exp) ** 2 / exp).sum())
    return chi2_sf(stat, max(1, len(obs) - 1))


def test_chi2_sf_against_known_values():
    # Table values of the chi-square distribution (upper tail).
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(2.0, 2) == pytest.approx(math.exp(-1.0), rel=1e-12)
    assert chi2_sf(135.8067, 100) == pytest.approx(0.01, rel=1e-4)
    assert chi_square_p([50, 50], [0.5, 0.5]) == pytest.approx(1.0)
    assert chi_square_p([90, 10], [0.5, 0.5]) < 1e-10
    with pytest.raises(AssertionError):
        chi_square_p([99, 1], [1.0, 0.0])


# --------------------------------------------------------------------------------------
# build_probs / penalties / history
# --------------------------------------------------------------------------------------

SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.6),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=0.8, top_k=5),
    SamplingParams(temperature=1.0, top_p=0.5),
    SamplingParams(temperature=1.3, top_p=0.9),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.95),
    SamplingParams(temperature=0.7, top_k=8, top_p=0.8, min_p=0.05),
    SamplingParams(temperature=1.0, presence_penalty=1.5),
    SamplingParams(temperature=1.0, frequency_penalty=0.7),
    SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=0.5),
    SamplingParams(temperature=0.9, top_p=0.7, presence_penalty=1.0, frequency_penalty=-0.3),
    SamplingParams(temperature=1.1, top_k=3, min_p=0.3, presence_penalty=0.5),
]


def _random_case(rng, vocab, rows, *, ties=False, neg_inf=False):
    logits = rng.normal(size=(rows, vocab)) * rng.uniform(0.3, 4.0)
    if ties:  # few distinct values -> many exact ties
        logits = np.round(logits)
    if neg_inf and vocab > 2:
        mask = rng.random((rows, vocab)) < 0.3
        mask[:, 0] = False
        logits[mask] = -np.inf
    counts = rng.integers(0, 3, size=(rows, vocab)) * (rng.random((rows, vocab)) < 0.3)
    return logits, counts


@pytest.mark.parametrize("params", SETTINGS, ids=repr)
def test_build_probs_matches_numpy_reference(params):
    rng = np.random.default_rng(zlib.crc32(repr(params).encode()))
    worst64 = worst32 = 0.0
    for trial in range(12):
        vocab = int(rng.choice([1, 2, 7, 50, 257]))
        logits, counts = _random_case(rng, vocab, 4, ties=trial % 3 == 1, neg_inf=trial % 4 == 2)
        want = ref_probs(logits, params, counts)
        got64 = S.build_probs(mx.array(logits, dtype=F64), params, mx.array(counts))
        got32 = S.build_probs(mx.array(logits, dtype=mx.float32), params, mx.array(counts))
        assert got64.dtype == F64 and got32.dtype == mx.float32
        g64, g32 = np.array(got64), np.array(got32)
        worst64 = max(worst64, float(np.abs(g64 - want).max()))
        assert np.array_equal(g64 > 0, want > 0), "support differs from the reference"
        worst32 = max(worst32, float(np.abs(g32 - want).max()))
    assert worst64 < 1e-12
    assert worst32 < 1e-5


def test_build_probs_without_counts_and_half_precision():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(3, 40))
    params = SamplingParams(temperature=0.8, top_p=0.9, presence_penalty=1.0)
    want = ref_probs(logits, params, None)  # no history: penalties do nothing
    got = np.array(S.build_probs(mx.array(logits, dtype=F64), params))
    np.testing.assert_allclose(got, want, atol=1e-12)
    half = S.build_probs(mx.array(logits, dtype=mx.bfloat16), params)
    assert half.dtype == mx.float32
    np.testing.assert_allclose(np.array(half).sum(axis=1), 1.0, atol=1e-5)


def test_tie_rules():
    logits = mx.array([[1.0, 3.0, 2.0, 3.0, 3.0, 0.0]], dtype=F64)
    greedy = np.array(S.build_probs(logits, SamplingParams()))
    assert greedy.tolist() == [[0, 1, 0, 0, 0, 0]]  # lowest id among the maxima
    assert np.array(S.argmax_tokens(logits, SamplingParams())).tolist() == [1]
    top2 = np.array(S.build_probs(logits, SamplingParams(temperature=1.0, top_k=2)))
    assert (top2 > 0).tolist() == [[False, True, False, True, True, False]]  # ties kept
    assert top2[0, 1] == pytest.approx(1 / 3, abs=1e-15)
    # top_p smaller than one tied token's mass still keeps all tied tokens.
    nuc = np.array(S.build_probs(logits, SamplingParams(temperature=1.0, top_p=0.05)))
    assert (nuc > 0).tolist() == [[False, True, False, True, True, False]]


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    logits = mx.array(np.log(probs)[None, :], dtype=F64)
    for top_p, keep in [(0.4, 1), (0.41, 2), (0.7, 2), (0.71, 3), (0.95, 4), (1e-9, 1)]:
        got = np.array(S.build_probs(logits, SamplingParams(temperature=1.0, top_p=top_p)))[0]
        assert int((got > 0).sum()) == keep, (top_p, got)
        np.testing.assert_allclose(got[:keep], probs[:keep] / probs[:keep].sum(), atol=1e-12)


def test_apply_penalties_openai_semantics():
    logits = mx.array([[1.0, 2.0, 3.0, 4.0]], dtype=F64)
    counts = mx.array([[0, 1, 3, 0]], dtype=mx.int32)
    out = np.array(S.apply_penalties(logits, counts, presence=0.5, frequency=0.25))
    np.testing.assert_allclose(out, [[1.0, 2.0 - 0.5 - 0.25, 3.0 - 0.5 - 0.75, 4.0]], atol=0)
    same = S.apply_penalties(logits, None, presence=9.0, frequency=9.0)
    assert np.array_equal(np.array(same), np.array(logits))


def test_history_counts_and_add_counts():
    rng = np.random.default_rng(5)
    base = rng.integers(0, 4, size=11).astype(np.float32)
    for k in range(0, 7):
        drafts = rng.integers(0, 11, size=k)
        got = np.array(S.history_counts(mx.array(base), mx.array(drafts, dtype=mx.int32)))
        assert got.shape == (k + 1, 11)
        for i in range(k + 1):
            want = base + np.bincount(drafts[:i], minlength=11)
            assert np.array_equal(got[i], want)
        added = np.array(S.add_counts(mx.array(base), mx.array(drafts, dtype=mx.int32)))
        assert np.array_equal(added, base + np.bincount(drafts, minlength=11))


# --------------------------------------------------------------------------------------
# sample
# --------------------------------------------------------------------------------------


def test_sample_distribution_zeros_and_reproducibility():
    probs = np.array([0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    n = 20000
    p = mx.array(np.tile(probs, (n, 1)), dtype=F64)
    draws = np.array(S.sample(p, S.make_key(7)))
    assert draws.dtype == np.int32 and draws.shape == (n,)
    assert chi_square_p(np.bincount(draws, minlength=7), probs) > 1e-3
    again = np.array(S.sample(p, S.make_key(7)))
    assert np.array_equal(draws, again)
    other = np.array(S.sample(p, S.make_key(8)))
    assert not np.array_equal(draws, other)
    onehot = mx.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=mx.float32)
    assert np.array(S.sample(onehot, S.make_key(1))).tolist() == [2, 0]


def test_key_stream_reproducible():
    a, b = S.KeyStream(42), S.KeyStream(42)
    ka = [np.array(a.next()) for _ in range(3)]
    kb = [np.array(b.next()) for _ in range(3)]
    assert all(np.array_equal(x, y) for x, y in zip(ka, kb))
    assert not np.array_equal(ka[0], ka[1])
    assert len(S.split_key(S.make_key(1), 4)) == 4


# --------------------------------------------------------------------------------------
# accept_sampled: Monte Carlo on the real function (vectorised over keys with mx.vmap)
# --------------------------------------------------------------------------------------


def _mc_rows(rng, vocab, k, dtype):
    """Fixed target rows (zeros from top-k / top-p) and draft rows with zeros of their own."""
    params = SamplingParams(temperature=0.9, top_k=vocab - 2, top_p=0.93)
    p = S.build_probs(mx.array(rng.normal(size=(k + 1, vocab)) * 1.5, dtype=dtype), params)
    q = rng.random((k, vocab)) ** 2 * (rng.random((k, vocab)) < 0.75)
    q[:, 0] += 0.05  # at least one non-zero per row
    q = mx.array(q / q.sum(axis=1, keepdims=True), dtype=dtype)
    return p, q


def _run_cycles(p, q, keys, *, argmax_drafts=None):
    def trial(key):
        k_draft, k_acc = S.split_key(key, 2)
        drafts = argmax_drafts if q is None else S.sample(q, k_draft)
        n, nxt = S.accept_sampled(p, q, drafts, k_acc)
        return drafts, n, nxt

    drafts, n, nxt = mx.vmap(trial)(keys)
    # vmap runs the real function: spot-check it against plain calls.
    for i in range(5):
        d1, n1, t1 = trial(keys[i])
        assert int(n1) == int(n[i]) and int(t1) == int(nxt[i])
    return np.array(drafts), np.array(n), np.array(nxt)


@pytest.mark.parametrize("dtype", [mx.float32, F64], ids=["f32", "f64"])
def test_accept_sampled_monte_carlo(dtype):
    rng = np.random.default_rng(11)
    vocab, k, trials = 9, 3, 30000
    p, q = _mc_rows(rng, vocab, k, dtype)
    keys = mx.random.split(S.make_key(2024), trials)
    drafts, n, nxt = _run_cycles(p, q, keys)
    pn, qn = np.array(p, dtype=np.float64), np.array(q, dtype=np.float64)
    # First emitted token ~ p_0 (independent of q).
    first = np.where(n >= 1, drafts[:, 0], nxt)
    assert chi_square_p(np.bincount(first, minlength=vocab), pn[0]) > 1e-3
    # Accepted count: with history-free rows, P(accept i | accepted < i) = sum min(p_i, q_i).
    beta = np.minimum(pn[:k], qn).sum(axis=1)
    reach = np.concatenate([[1.0], np.cumprod(beta)])
    p_n = reach * np.concatenate([1 - beta, [1.0]])
    assert chi_square_p(np.bincount(n, minlength=k + 1), p_n) > 1e-3
    # After all k accepted, the bonus token ~ p_k.
    bonus = nxt[n == k]
    assert bonus.size > 250
    assert chi_square_p(np.bincount(bonus, minlength=vocab), pn[k]) > 1e-3
    # Emitted drafts are the real drafts.
    assert ((n >= 0) & (n <= k)).all()


def test_accept_sampled_monte_carlo_argmax_drafts():
    rng = np.random.default_rng(12)
    vocab, k, trials = 7, 2, 20000
    p, _ = _mc_rows(rng, vocab, k, F64)
    pn = np.array(p)
    drafts = mx.array([int(np.argsort(pn[0])[-2]), int(np.argmax(pn[1]))], dtype=mx.int32)
    keys = mx.random.split(S.make_key(99), trials)
    _, n, nxt = _run_cycles(p, None, keys, argmax_drafts=drafts)
    first = np.where(n >= 1, int(drafts[0]), nxt)
    assert chi_square_p(np.bincount(first, minlength=vocab), pn[0]) > 1e-3
    # Position 0 is accepted with probability p_0(d_0) exactly (q one-hot).
    acc = (n >= 1).mean()
    se = math.sqrt(pn[0, int(drafts[0])] * (1 - pn[0, int(drafts[0])]) / trials)
    assert abs(acc - pn[0, int(drafts[0])]) < 5 * se


def test_monte_carlo_check_has_power():
    """The same check rejects the raw drafts: q differs detectably from p in these cases."""
    rng = np.random.default_rng(11)
    p, q = _mc_rows(rng, 9, 3, F64)
    keys = mx.random.split(S.make_key(2024), 30000)
    drafts, n, nxt = _run_cycles(p, q, keys)
    p0 = np.array(p)[0]
    raw = np.bincount(drafts[:, 0], minlength=9) / len(drafts)
    emitted = np.bincount(np.where(n >= 1, drafts[:, 0], nxt), minlength=9) / len(drafts)
    assert np.abs(raw - p0).sum() > 0.2
    assert np.abs(emitted - p0).sum() < 0.03
    # ...and always emitting the first draft would be wrong too (rejections do happen).
    assert 0 < (n == 0).mean() < 1


# --------------------------------------------------------------------------------------
# Greedy verification and self-drafting
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", range(1, 7))
def test_accept_greedy_edge_cases(k):
    rng = np.random.default_rng(k)
    target = rng.integers(0, 50, size=k + 1)
    for mismatch in range(k + 1):  # mismatch == k: all accepted
        drafts = target[:k].copy()
        if mismatch < k:
            drafts[mismatch] = (target[mismatch] + 1) % 50
            if mismatch + 1 < k:  # later positions match again: must still stop
                drafts[mismatch + 1 :] = target[mismatch + 1 : k]
        n, nxt = S.accept_greedy(mx.array(target), mx.array(drafts))
        assert n.dtype == mx.int32 and nxt.dtype == mx.int32
        assert int(n) == mismatch
        assert int(nxt) == target[mismatch]
    n, nxt = S.accept_greedy(mx.array(target[:1]), mx.array(np.zeros(0, dtype=np.int32)))
    assert (int(n), int(nxt)) == (0, target[0])


@pytest.mark.parametrize("k", range(1, 7))
def test_self_argmax_drafter_accepted_everywhere(k):
    """A drafter proposing the target's own argmax is accepted at every position."""
    rng = np.random.default_rng(100 + k)
    vocab = 30
    logits = mx.array(rng.normal(size=(k + 1, vocab)) * 3, dtype=mx.float32)
    greedy = SamplingParams(temperature=0.0, presence_penalty=0.4)
    counts = S.history_counts(mx.zeros((vocab,)), mx.zeros((k,), dtype=mx.int32))
    target = S.argmax_tokens(logits, greedy, counts)
    drafts = target[:k]
    n, nxt = S.accept_greedy(target, drafts)
    assert (int(n), int(nxt)) == (k, int(target[k]))
    p = S.build_probs(logits, greedy, counts)  # one-hot rows
    for seed in range(20):
        n, nxt = S.accept_sampled(p, None, drafts, S.make_key(seed))
        assert (int(n), int(nxt)) == (k, int(target[k]))
    # Same with an explicit one-hot q (q == p): min(1, p/q) == 1.
    n, nxt = S.accept_sampled(p, p[:k], drafts, S.make_key(0))
    assert (int(n), int(nxt)) == (k, int(target[k]))


def test_accept_sampled_one_hot_target_rejects_wrong_draft_and_corrects():
    p = mx.array([[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0]], dtype=F64)
    for seed in range(10):
        n, nxt = S.accept_sampled(p, None, mx.array([2, 3], dtype=mx.int32), S.make_key(seed))
        assert (int(n), int(nxt)) == (1, 1)


def test_accept_sampled_depth_zero():
    p = mx.array([[0.0, 0.0, 1.0]], dtype=F64)
    n, nxt = S.accept_sampled(p, None, mx.zeros((0,), dtype=mx.int32), S.make_key(0))
    assert (int(n), int(nxt)) == (0, 2)


def test_cycle_traces_without_host_sync(tmp_path):
    """mx.export_function traces with placeholders and raises on any .item()/eval/np.array
    inside, so an exported whole cycle proves the functions never synchronise; the
    re-imported graph must give the eager results."""
    rng = np.random.default_rng(1)
    vocab = 16
    logits = mx.array(rng.normal(size=(4, vocab)), dtype=mx.float32)
    draft_logits = mx.array(rng.normal(size=(3, vocab)), dtype=mx.float32)
    base = mx.array(rng.integers(0, 2, size=vocab), dtype=mx.float32)
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.9, min_p=0.02,
                            presence_penalty=0.3, frequency_penalty=0.2)

    def cycle(lg, dl, base, key):
        k_draft, k_acc = S.split_key(key, 2)
        q = S.build_probs(dl, params)
        drafts = S.sample(q, k_draft)
        counts = S.history_counts(base, drafts)
        p = S.build_probs(lg, params, counts)
        n, nxt = S.accept_sampled(p, q, drafts, k_acc)
        g_n, g_t = S.accept_greedy(S.argmax_tokens(lg, params, counts), drafts)
        return drafts, n, nxt, g_n, g_t, S.add_counts(base, drafts)

    path = str(tmp_path / "cycle.mlxfn")
    mx.export_function(path, cycle, logits, draft_logits, base, S.make_key(0))
    traced = mx.import_function(path)
    outcomes = set()
    for seed in range(8):
        key = S.make_key(seed)
        eager = cycle(logits, draft_logits, base, key)
        again = traced(logits, draft_logits, base, key)
        for e, t in zip(eager, again):
            assert np.array_equal(np.array(e), np.array(t))
        outcomes.add((int(eager[1]), int(eager[2])))
    assert len(outcomes) > 1  # the key really drives the cycle
