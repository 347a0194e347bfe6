"""The compact top-k sampler (engine.candidates): bit-exact against a full sort at Qwen's
vocabulary, the same distribution as sampling.build_probs, exact acceptance, and the dense
redo when logits tie at the top-k boundary."""
from __future__ import annotations

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine import candidates as C
from engine import decode
from engine import sampling as S
from engine.types import SamplingParams

QWEN_V = 248_320
PARAMS = [SamplingParams(temperature=0.6, top_p=0.95, top_k=20),
          SamplingParams(temperature=0.7, top_p=0.8, top_k=20, min_p=0.05),
          SamplingParams(temperature=1.0, top_k=64, presence_penalty=0.5, frequency_penalty=0.2)]


def _logits(rng, rows: int, vocab: int) -> np.ndarray:
    x = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
    x[1] = np.round(x[1] * 2) / 2          # coarse values: ties everywhere
    x[2, rng.choice(vocab, 40, replace=False)] = 30.0  # 40 tokens tie at the very top
    x[3, rng.choice(vocab, 19, replace=False)] = 25.0  # 19 at the top, the 20th is random
    return x


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_selection_is_bit_identical_to_a_full_sort_at_qwen_vocab(params):
    rng = np.random.default_rng(0)
    logits = mx.array(_logits(rng, 5, QWEN_V))
    counts = mx.array(rng.integers(0, 3, size=(5, QWEN_V)).astype(np.float32))
    ref = C.build(logits, params, counts, method="sort")
    for method in ("blocks", "partition"):
        got = C.build(logits, params, counts, method=method)
        assert np.array_equal(np.array(got.probs), np.array(ref.probs))  # bit for bit
        assert np.array_equal(np.array(got.exact), np.array(ref.exact))
        exact = np.array(got.exact)
        for r in np.flatnonzero(exact):  # no boundary tie: the same token set
            assert set(np.array(got.ids[r]).tolist()) == set(np.array(ref.ids[r]).tolist())
    x = np.array(C.scaled_logits(logits, params, counts))
    kth = np.sort(x, axis=1)[:, -params.top_k]
    assert np.array(ref.exact).tolist() == [int((x[r] >= kth[r]).sum()) == params.top_k
                                            for r in range(5)]
    assert not np.array(ref.exact)[1]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_compact_equals_build_probs_where_exact(params):
    rng = np.random.default_rng(1)
    vocab = 5000
    logits = mx.array(_logits(rng, 5, vocab))
    counts = mx.array(rng.integers(0, 3, size=(5, vocab)).astype(np.float32))
    got = C.build(logits, params, counts)
    dense = np.array(got.dense(vocab))
    want = np.array(S.build_probs(logits, params, counts))
    exact = np.array(got.exact)
    np.testing.assert_allclose(dense[exact], want[exact], rtol=1e-6, atol=1e-7)
    # where flagged, the dense rule may keep more (all boundary ties): the flag is needed
    more = (want[~exact] > 0).sum(axis=1) - (dense[~exact] > 0).sum(axis=1)
    assert (more >= 0).all() and (more > 0).any()


def test_compact_acceptance_matches_the_dense_rule():
    """First emitted token of compact accept_sampled ~ the target row 0 (chi-square), with
    compact q and argmax drafts."""
    scipy = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(2)
    vocab, k, n = 64, 2, 3000
    params = SamplingParams(temperature=1.0, top_k=6, top_p=0.9)
    p = C.build(mx.array(rng.normal(size=(k + 1, vocab)).astype(np.float32) * 1.5), params)
    q = C.build(mx.array(rng.normal(size=(k, vocab)).astype(np.float32) * 1.5), params)
    target = np.array(p.dense(vocab))[0]
    for qq in (q, None):
        keys = S.split_key(S.make_key(7), n)
        seen = np.zeros(vocab)
        for key in keys:
            kd, ka = S.split_key(key, 2)
            drafts = C.sample(qq, kd) if qq is not None else p.ids[:k, 1]
            nacc, extra = C.accept_sampled(p, qq, drafts, ka)
            first = drafts[0] if int(nacc.item()) > 0 else extra
            seen[int(first.item())] += 1
        support = target > 0
        assert seen[~support].sum() == 0
        expected = target[support].astype(np.float64)
        _, pval = scipy.chisquare(seen[support], expected / expected.sum() * seen.sum())
        assert pval > 1e-3


def test_boundary_ties_redo_densely(tiny_model, monkeypatch):
    """Forcing every compact result to report a boundary tie must give exactly what the
    dense sampler gives with the same keys: plain decoding rewinds its queued step, a
    speculative cycle redoes its acceptance."""
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.9)
    prompt = list(range(3, 40))

    def ids(depth):
        tiny_model.reset_prompt_cache()
        return [t for ev in tiny_model.generate(prompt, max_tokens=24, depth=depth,
                                                sampling=params, seed=11) for t in ev.token_ids]

    build = C.build
    monkeypatch.setattr(C, "applies", lambda *a, **k: False)
    dense = {0: ids(0)}
    monkeypatch.setattr(C, "applies", lambda *a, **k: True)
    monkeypatch.setattr(C, "build", lambda *a, **k: _tied(build(*a, **k)))
    assert ids(0) == dense[0]
    from engine import cycle

    redone, accept = [], cycle.accept
    monkeypatch.setattr(cycle, "accept", lambda *a, **k: redone.append(k.get("dense"))
                        or accept(*a, **k))
    assert ids(2)  # drafts differ from the dense run's (compact q): every cycle is redone
    assert redone.count(True) == redone.count(None) > 0


def _tied(c: C.Candidates) -> C.Candidates:
    return C.Candidates(ids=c.ids, probs=c.probs, exact=mx.zeros(c.exact.shape, dtype=mx.bool_))


def test_first_token_redo():
    logits = mx.array([[0.0, 2.0, 2.0, 2.0, 1.0]])
    params = SamplingParams(temperature=1.0, top_k=2)
    _, exact = decode._pick(logits, params, None, S.make_key(0))
    assert not bool(exact.item())  # three tokens tie at the 2nd value: dense keeps all three
    seen = {int(decode._pick(logits, params, None, S.make_key(s), dense=True)[0].item())
            for s in range(60)}
    assert seen == {1, 2, 3}
