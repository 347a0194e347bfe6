"""The compact top-k sampler (engine.sampling.candidates): bit-exact against a full sort at Qwen's
vocabulary, the same distribution as sampling.build_probs, exact acceptance, and the dense
redo when logits tie at the top-k boundary."""
from __future__ import annotations

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine.core.carryover import carryover_of
from engine.decoding import draw
from engine.sampling import candidates as C, exact as S
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


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.9, top_k=8, top_p=0.9),
                                    SamplingParams(temperature=0.9, top_p=0.9)], ids=str)
def test_boundary_ties_redo_densely(tiny_model, monkeypatch, params):
    """Forcing every compact result to report a boundary tie (or an uncertain top-p cut-off)
    must give exactly what the dense sampler gives with the same keys: plain decoding rewinds
    its queued step, a speculative cycle redoes its acceptance."""
    prompt = list(range(3, 40))

    def ids(depth):
        carryover_of(tiny_model).reset_prompt_cache()
        return [t for ev in tiny_model.generate(prompt, max_tokens=24, depth=depth,
                                                sampling=params, seed=11) for t in ev.token_ids]

    build = C.build
    monkeypatch.setattr(C, "applies", lambda *a, **k: False)
    dense = {0: ids(0)}
    monkeypatch.setattr(C, "applies", lambda *a, **k: True)
    monkeypatch.setattr(C, "build", lambda *a, **k: _tied(build(*a, **k)))
    assert ids(0) == dense[0]
    from engine.decoding import acceptance

    redone, accept = [], acceptance.accept
    monkeypatch.setattr(acceptance, "accept", lambda *a, **k: redone.append(k.get("dense"))
                        or accept(*a, **k))
    assert ids(2)  # drafts differ from the dense run's (compact q): every cycle is redone
    assert redone.count(True) == redone.count(False) > 0


def _tied(c: C.Candidates) -> C.Candidates:
    return C.Candidates(ids=c.ids, probs=c.probs, exact=mx.zeros(c.exact.shape, dtype=mx.bool_))


def test_first_token_redo():
    logits = mx.array([[0.0, 2.0, 2.0, 2.0, 1.0]])
    params = SamplingParams(temperature=1.0, top_k=2)
    _, exact = draw.pick(logits, params, None, S.make_key(0))
    assert not bool(exact.item())  # three tokens tie at the 2nd value: dense keeps all three
    seen = {int(draw.pick(logits, params, None, S.make_key(s), dense=True)[0].item())
            for s in range(60)}
    assert seen == {1, 2, 3}


# --------------------------------------------------------------------------------------
# Nucleus: top-p / min-p without top-k
# --------------------------------------------------------------------------------------

NUCLEUS = [SamplingParams(temperature=0.6, top_p=0.95),
           SamplingParams(temperature=0.7, min_p=0.05),
           SamplingParams(temperature=0.6, top_p=0.9, min_p=0.02),
           SamplingParams(temperature=1.0, top_p=0.95, presence_penalty=1.5,
                          frequency_penalty=0.5)]


def _llm_row(rng, vocab: int, slope: float, bulk: float = -40.0) -> np.ndarray:
    """A Zipf head of 2000 tokens (rank r at -slope·log r) over a bulk far below."""
    x = rng.normal(bulk, 3.0, size=vocab)
    head = rng.choice(vocab, 2000, replace=False)
    x[head] = -slope * np.log(np.arange(1, 2001)) + rng.normal(0, 0.05, 2000)
    return x


def _tied_row(rng, vocab: int, n: int, near: bool = False) -> np.ndarray:
    """One top token, ``n`` tied 2 below it (top-p 0.95's cut-off falls inside them at
    temperatures 0.6-1), optionally one more just below the ties, a bulk far below."""
    x = rng.normal(-40.0, 3.0, size=vocab)
    at = rng.choice(vocab, n + 2, replace=False)
    x[at[0]] = 0.0
    x[at[1:n + 1]] = -2.0
    if near:
        x[at[-1]] = -2.0 - 3e-5  # within LOGIT_GAP of the ties
    return x


def _nucleus_logits(rng, vocab: int = QWEN_V) -> tuple[np.ndarray, dict[str, int]]:
    """LLM-like rows (expected exact where their kept set fits the candidates) and rows that
    stress the rule; ``rows`` names the latter."""
    rows = [_llm_row(rng, vocab, s) for s in (1.5, 2.0, 3.0, 5.0)]
    rows += [_tied_row(rng, vocab, 20),             # the cut falls inside 20 ties
             _tied_row(rng, vocab, 200),            # the ties run past the candidates
             _tied_row(rng, vocab, 20, near=True),
             rng.normal(0.0, 1.0, size=vocab)]      # flat: 128 candidates hold < 1% of it
    names = {"ties": 4, "many": 5, "near": 6, "flat": 7}
    return np.array(rows, dtype=np.float32) * 0.6, names  # ~ logits before temperature


def _check_where_exact(c: C.Candidates, want: np.ndarray) -> np.ndarray:
    """Where ``c.exact``: the same kept tokens as ``want`` (build_probs) and the same
    probabilities up to float32 rounding (they are renormalised from a different float32 sum
    of up to 128 terms, so not bit for bit: ~1e-6 apart with 48 kept). Returns the flags."""
    exact = np.array(c.exact)
    got = np.array(c.dense(want.shape[1]))
    scattered = np.zeros_like(want)
    np.add.at(scattered, (np.arange(want.shape[0])[:, None], np.array(c.ids)), np.array(c.probs))
    assert np.array_equal(got, scattered)
    for r in np.flatnonzero(exact):
        assert np.array_equal(got[r] > 0, want[r] > 0), r
        np.testing.assert_allclose(got[r], want[r], rtol=1e-5, atol=0)  # ~k ulps
    assert np.allclose(np.array(c.probs).sum(axis=1), 1.0, atol=1e-5)  # a q for drafts too
    return exact


@pytest.mark.parametrize("params", NUCLEUS, ids=str)
def test_nucleus_equals_build_probs_where_exact_at_qwen_vocab(params):
    rng = np.random.default_rng(3)
    x, rows = _nucleus_logits(rng)
    counts = np.zeros_like(x)
    counts[:, rng.choice(QWEN_V, 300, replace=False)] = rng.integers(1, 3, size=300)
    logits, counts = mx.array(x), mx.array(counts)
    assert C.applies(params, QWEN_V)
    c = C.build(logits, params, counts)
    want = np.array(S.build_probs(logits, params, counts))
    exact = _check_where_exact(c, want)
    kept = (want > 0).sum(axis=1)
    fits = kept <= C.NUCLEUS_K
    # the check has power: LLM-like rows are compact (at temperature 1 the heads are flatter
    # and their tails heavier, and the cut-off cannot always be certified)
    assert exact[:4][fits[:4]].all() if params.temperature < 1.0 else exact[:4].any()
    if params.top_p < 1.0 and params.min_p == 0.0:
        assert exact[rows["ties"]] and kept[rows["ties"]] == 21   # every tie kept
        assert not exact[rows["many"]] and kept[rows["many"]] == 201
        assert not exact[rows["near"]]
    if params.top_p < 1.0:
        assert not exact[rows["flat"]]       # the cut-off lies far beyond the candidates


def test_nucleus_is_never_exact_where_build_probs_differs():
    """Random head slopes, bulk depths and widths (many rows whose tail holds ~1e-3 of the
    mass, where the float32 sum of build_probs is itself uncertain at that level)."""
    rng = np.random.default_rng(4)
    rows = []
    for _ in range(24):
        x = _llm_row(rng, QWEN_V, rng.uniform(1.1, 4.0), bulk=rng.uniform(-45, -15))
        x[rng.choice(QWEN_V, 30)] = np.round(x[rng.choice(QWEN_V, 30)])  # scattered ties
        rows.append(x)
    logits = mx.array(np.array(rows, dtype=np.float32))
    seen = 0
    for params in NUCLEUS[:3] + [SamplingParams(temperature=1.0, top_p=0.5),
                                 SamplingParams(temperature=1.3, top_p=0.99, min_p=0.001)]:
        c = C.build(logits, params)
        seen += _check_where_exact(c, np.array(S.build_probs(logits, params))).sum()
    assert seen >= 24  # the check has power: many rows are compact


def test_nucleus_min_p_on_the_threshold_is_not_exact():
    x = np.full((1, 5000), -50.0, dtype=np.float32)
    x[0, :3] = [0.0, -1.0, np.float32(np.log(np.float32(0.05)))]
    c = C.build(mx.array(x), SamplingParams(temperature=1.0, min_p=0.05))
    assert not bool(c.exact[0])
    x[0, 2] = -2.9  # clear of the threshold: kept, exact
    c = C.build(mx.array(x), SamplingParams(temperature=1.0, min_p=0.05))
    assert bool(c.exact[0]) and (np.array(c.probs[0]) > 0).sum() == 3


@pytest.mark.parametrize("vocab", [6, 100, 5000, 10_007])
def test_nucleus_small_and_odd_vocabularies(vocab):
    """The whole row as candidates (V <= 8192) and a vocabulary that is no multiple of the
    block (padded with -inf), masked rows (-inf logits) included."""
    rng = np.random.default_rng(vocab)
    x = (rng.normal(size=(4, vocab)) * 4).astype(np.float32)
    x[1, rng.choice(vocab, vocab - 3, replace=False)] = -np.inf  # a grammar mask: 3 allowed
    x[2] = np.round(x[2])
    for params in NUCLEUS:
        c = C.build(mx.array(x), params)
        exact = _check_where_exact(c, np.array(S.build_probs(mx.array(x), params)))
        assert exact[1]
        assert np.array(c.ids).max() < vocab


def test_applies():
    V = 1000
    assert C.applies(SamplingParams(temperature=0.6, top_p=0.95), V)
    assert C.applies(SamplingParams(temperature=0.6, min_p=0.1), V)
    assert C.applies(SamplingParams(temperature=0.6, top_k=V, top_p=0.9), V)  # top-k off
    assert C.applies(SamplingParams(temperature=0.6, top_k=20), V)
    assert not C.applies(SamplingParams(temperature=0.6), V)          # nothing filters
    assert not C.applies(SamplingParams(temperature=0.6, top_k=300, top_p=0.9), V)
    assert not C.applies(SamplingParams(temperature=0.0, top_p=0.9), V)
    assert not C.applies(SamplingParams(temperature=0.6, top_p=0.9), V, mx.float64)


def test_nucleus_allows_for_the_float32_sum_of_build_probs():
    """build_probs' float32 normaliser drops terms below half an ulp of its running sum: with
    the top token first, 248k tail terms of 4.5e-8 (1.1% of the mass) vanish from it. With
    top_p between the top token's probability under that sum and under the exact one, or
    just below the former, the two cut-offs differ (1 token kept or 6): the compact path must
    not call it."""
    x = np.full((1, QWEN_V), np.log(4.5e-8), dtype=np.float32)
    x[0, 0] = 0.0
    x[0, 1:6] = np.log(0.01)
    p0 = float(np.array(S.softmax(mx.array(x)))[0, 0])
    exact_p0 = 1.0 / np.exp(x[0].astype(np.float64)).sum()
    for top_p in ((p0 + exact_p0) / 2, p0 - 1e-6):
        params = SamplingParams(temperature=1.0, top_p=top_p)
        c = C.build(mx.array(x), params)
        assert not bool(c.exact[0])
        _check_where_exact(c, np.array(S.build_probs(mx.array(x), params)))


COMPILED_PARAMS = PARAMS + [SamplingParams(temperature=0.6, top_p=0.95),
                            SamplingParams(temperature=0.8, min_p=0.1, presence_penalty=0.3)]


@pytest.mark.parametrize("params", COMPILED_PARAMS, ids=str)
@pytest.mark.parametrize("vocab", [4096, QWEN_V])
def test_compiled_draft_and_acceptance_are_bit_identical(params, vocab):
    """``compiled_draft`` / ``accept_compiled`` (what drafts and acceptance run) give the
    uncompiled ``build`` + ``sample`` / ``accept_sampled`` values bit for bit: the draft
    token, its q row, and (n, extra, exact) with and without q, at depths 0-4, ties included."""
    rng = np.random.default_rng(vocab + int(params.temperature * 10))
    penalised = params.presence_penalty != 0 or params.frequency_penalty != 0
    for trial in range(6):
        k = trial % 5
        x = mx.array(_logits(rng, max(k + 1, 4), vocab)[:k + 1])
        counts = mx.array(rng.integers(0, 3, size=(k + 1, vocab)).astype(np.float32)) \
            if penalised else None
        key = S.make_key(trial)
        draw = C.compiled_draft(params, penalised)
        row_counts = None if counts is None else counts[:1]
        got = draw(x[:1], key) if counts is None else draw(x[:1], key, row_counts)
        ref_c = C.build(x[:1], params, row_counts)
        ref = (C.sample(ref_c, key), ref_c.ids, ref_c.probs, ref_c.exact)
        for a, b in zip(got, ref):
            assert np.array_equal(np.array(a), np.array(b))
        drafts = mx.array(rng.integers(0, vocab, size=k).astype(np.int32))
        if k:
            drafts[0] = ref_c.ids[0, 0]  # one draft the target likes
        qs = [C.build(x[i:i + 1] * 0.9, params) for i in range(k)]
        for q in ([None, C.Candidates.stack(qs)] if k else [None]):
            got = C.accept_compiled(x, params, counts, q, drafts, key)
            p = C.build(x, params, counts)
            n, extra = C.accept_sampled(p, q, drafts, key)
            for a, b in zip(got, (n, extra, mx.all(p.exact))):
                assert np.array_equal(np.array(a), np.array(b))


UNPENALISED = [p for p in COMPILED_PARAMS if p.presence_penalty == 0 and p.frequency_penalty == 0]


@pytest.mark.parametrize("params", UNPENALISED, ids=str)
@pytest.mark.parametrize("vocab", [4096, QWEN_V])
def test_row_group_draft_equals_each_row_alone(params, vocab):
    """``compiled_draft_rows`` (a batch's rows that share parameters, one call) gives every
    row what ``compiled_draft`` gives it alone with its own key: token and q row, bit for bit
    (ties included), so a seeded stream drafts the same batched or alone."""
    rng = np.random.default_rng(vocab + 7)
    for rows in (2, 5):
        x = mx.array(_logits(rng, 5, vocab)[:rows])
        keys = [S.make_key(100 * rows + i) for i in range(rows)]
        got = C.compiled_draft_rows(params)(x, mx.stack(keys))
        alone = C.compiled_draft(params, False)
        for i in range(rows):
            ref = alone(x[i:i + 1], keys[i])
            for a, b in zip(got, ref):
                assert np.array_equal(np.array(a[i:i + 1]), np.array(b).reshape(-1, *a.shape[1:]))


@pytest.mark.parametrize("params", UNPENALISED, ids=str)
@pytest.mark.parametrize("vocab", [4096, QWEN_V])
def test_row_group_acceptance_equals_each_row_alone(params, vocab):
    """``compiled_accept_rows`` (a batch's rows of one depth and parameter set, one call)
    gives each row the (n, extra, exact) ``accept_compiled`` gives it alone with its key,
    bit for bit, whether its drafts are accepted or not (ties included)."""
    rng = np.random.default_rng(vocab + 11)
    for rows, k in ((2, 1), (3, 3), (5, 2)):
        x = mx.array(np.stack([_logits(rng, max(k + 1, 4), vocab)[:k + 1] for _ in range(rows)]))
        keys = [S.make_key(1000 + 10 * rows + i) for i in range(rows)]
        qs = [C.Candidates.stack([C.build(x[i, j:j + 1] * 0.9, params) for j in range(k)])
              for i in range(rows)]
        drafts = mx.array(rng.integers(0, vocab, size=(rows, k)).astype(np.int32))
        for i in range(rows):  # the first draft of some rows is one the target likes
            if i % 2 == 0:
                drafts[i, 0] = C.build(x[i, :1], params).ids[0, 0]
        got = C.compiled_accept_rows(params)(
            x, drafts, mx.stack(keys), mx.stack([q.ids for q in qs]),
            mx.stack([q.probs for q in qs]), mx.stack([q.exact for q in qs]))
        for i in range(rows):
            ref = C.accept_compiled(x[i], params, None, qs[i], drafts[i], keys[i])
            for a, b in zip(got, ref):
                assert np.array_equal(np.array(a[i]), np.array(b))
