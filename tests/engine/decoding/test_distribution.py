"""Sampled speculative decoding follows the plain-decoding distribution (chi-square).

A tiny-vocabulary model (V = 6) makes the exact distribution of the first generated tokens
computable by enumeration with plain forwards; the engine's samples at depths 1-3 (drafts
sampled from the MTP head's own distribution, then accepted/rejected) must fit it.
"""
from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

import engine
from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.sampling import exact as sampling
from tests.tinymodels import build_tiny_model

V = 6
PROMPT = [1, 4, 2, 5]
SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.3, top_p=0.8, presence_penalty=0.5, frequency_penalty=0.3),
    SamplingParams(temperature=1.3, min_p=0.1),
]
N = 1500


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory):
    d = build_tiny_model(tmp_path_factory.mktemp("v6") / "m", vocab_size=V, seed=21, hidden=32)
    m = engine.load(d)
    # no EOS inside the 6-token vocabulary: every run yields exactly max_tokens tokens
    return engine.Model(trunk=m.trunk, mtp=m.mtp, tokenizer=m.tokenizer,
                        info=dataclasses.replace(m.info, eos_token_ids=()))


def _next_probs(model, prefix: list[int], generated: list[int], params) -> np.ndarray:
    logits = model.trunk(mx.array(prefix)[None])[:, -1]
    counts = np.zeros(V, np.float32)
    for t in generated:
        counts[t] += 1
    p = sampling.build_probs(logits, params, mx.array(counts)[None])
    return np.array(p[0], dtype=np.float64)


def exact_pair_distribution(model, params) -> np.ndarray:
    """P(t2, t3) under plain sampling, marginalised over t1."""
    p1 = _next_probs(model, PROMPT, [], params)
    joint = np.zeros((V, V))
    for t1 in range(V):
        p2 = _next_probs(model, PROMPT + [t1], [t1], params)
        for t2 in range(V):
            p3 = _next_probs(model, PROMPT + [t1, t2], [t1, t2], params)
            joint[t2] += p1[t1] * p2[t2] * p3
    return joint


def chi_square_p(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    from scipy.stats import chi2

    exp = expected_probs * counts.sum()
    keep = exp >= 5
    obs_k, exp_k = counts[keep], exp[keep]
    obs_rest, exp_rest = counts[~keep].sum(), exp[~keep].sum()
    if exp_rest > 0:
        obs_k = np.append(obs_k, obs_rest)
        exp_k = np.append(exp_k, exp_rest)
    stat = ((obs_k - exp_k) ** 2 / exp_k).sum()
    return float(chi2.sf(stat, len(obs_k) - 1))


@pytest.mark.parametrize("params", SETTINGS,
                         ids=["t1", "t0.7-k4", "t1.3-p0.8-pen", "t1.3-minp0.1"])
def test_speculative_samples_follow_plain_distribution(small_vocab_model, params):
    pytest.importorskip("scipy")
    model = small_vocab_model
    expected = exact_pair_distribution(model, params).ravel()
    assert abs(expected.sum() - 1) < 1e-6
    for depth in (1, 2, 3):
        counts = np.zeros(V * V)
        accepted = 0
        carryover_of(model).reset_prompt_cache()
        for i in range(N):
            toks = []
            # max_tokens = depth + 2: the first cycle runs at full depth and emits t2, t3
            for ev in model.generate(PROMPT, max_tokens=max(3, depth + 2), depth=depth,
                                     sampling=params, seed=7919 * depth + i + 1):
                toks.extend(ev.token_ids)
                if ev.stats:
                    accepted += ev.stats.accepted
            counts[toks[1] * V + toks[2]] += 1
        p = chi_square_p(counts, expected)
        assert p > 0.001, (depth, p)
        if params.top_p == 1.0 and params.min_p == 0.0:
            # the acceptance path was exercised, not only corrections (with top-p 0.8 or
            # min-p 0.1 the random MTP head's kept tokens never overlap the target's: dense too)
            assert accepted > 0


@pytest.mark.parametrize("mode", ["softmax", "argmax"])
def test_every_draft_mode_follows_plain_distribution(small_vocab_model, mode):
    """The other MTP draft policies (``draft_mode``; "filtered" is the default tested above)
    are exact too: drafts sampled without the target's filters, or the head's argmax."""
    pytest.importorskip("scipy")
    model, params, depth = small_vocab_model, SETTINGS[1], 2  # top-k 4: the modes differ
    expected = exact_pair_distribution(model, params).ravel()
    counts = np.zeros(V * V)
    accepted = 0
    carryover_of(model).reset_prompt_cache()
    for i in range(N):
        toks = []
        for ev in model.generate(PROMPT, max_tokens=depth + 2, depth=depth, sampling=params,
                                 seed=104729 + i, draft_mode=mode):
            toks.extend(ev.token_ids)
            accepted += ev.stats.accepted if ev.stats else 0
        counts[toks[1] * V + toks[2]] += 1
    p = chi_square_p(counts, expected)
    assert p > 0.001, (mode, p)
    assert accepted > 0


@pytest.mark.parametrize("params", SETTINGS,
                         ids=["t1", "t0.7-k4", "t1.3-p0.8-pen", "t1.3-minp0.1"])
def test_a_draft_vocabulary_keeps_the_plain_distribution(small_vocab_model, params,
                                                         monkeypatch):
    """Drafts scored on 3 of the 6 tokens (``engine.decoding.draft_vocab``: ids 0, 3 and 5,
    so positions and ids differ): tokens 1, 2 and 4 are never drafted, only produced by the
    verify, and the output still fits plain sampling."""
    pytest.importorskip("scipy")
    from engine.decoding import draft_vocab
    from engine.decoding.window import DRAFT_VOCAB_ENV

    monkeypatch.setenv(DRAFT_VOCAB_ENV, "3")
    monkeypatch.setattr(draft_vocab, "special_ids", lambda model: {3, 5})
    monkeypatch.setattr(draft_vocab, "MAX_MISSES", 1.0)  # draft on the set whatever the tokens
    model, depth = small_vocab_model, 2
    expected = exact_pair_distribution(model, params).ravel()
    counts = np.zeros(V * V)
    carryover_of(model).reset_prompt_cache()
    for i in range(N):
        toks = []
        for ev in model.generate(PROMPT, max_tokens=depth + 2, depth=depth, sampling=params,
                                 seed=15485863 + i):
            toks.extend(ev.token_ids)
        counts[toks[1] * V + toks[2]] += 1
    assert np.array(draft_vocab.for_model(model).ids).tolist() == [0, 3, 5]
    p = chi_square_p(counts, expected)
    assert p > 0.001, p
