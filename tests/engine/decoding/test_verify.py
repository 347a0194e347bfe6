"""``engine.decoding.verify``: the exactness check passes on the engine and FAILS when the
acceptance rule is broken on purpose (drafts always accepted), on the tiny test model.

Seeded and with a fixed number of replies, so neither verdict can flake: the passing run's
p-value sits far above the check's threshold (p = 0.001) and the broken run's far below.
"""
from __future__ import annotations

import math
import threading

import mlx.core as mx
import pytest

from engine.decoding import verify as V
from engine.sampling import candidates, exact

REPLIES = 300
PROMPTS = ("Tell me a story.", "Hi!")


def _always_accept_candidates(p, q, drafts, key):
    """The compact acceptance with its rule broken: every draft accepted, then the bonus."""
    k = drafts.shape[0]
    if k == 0:
        return _ORIG_CANDIDATES(p, q, drafts, key)
    _, k_s = exact.split_key(key, 2)
    bonus = p.row(k)
    j = exact.sample(bonus.probs, k_s)[0]
    return mx.array(k, dtype=mx.int32), mx.take(bonus.ids[0], j)


def _always_accept_dense(p, q, drafts, key):
    k = drafts.shape[0]
    if k == 0:
        return _ORIG_DENSE(p, q, drafts, key)
    _, k_s = exact.split_key(key, 2)
    return mx.array(k, dtype=mx.int32), exact.sample(p[k:k + 1], k_s)[0]


_ORIG_CANDIDATES = candidates.accept_sampled
_ORIG_DENSE = exact.accept_sampled


def _clear_compiled():
    for f in (candidates.compiled_accept, candidates.compiled_accept_rows):
        f.cache_clear()


@pytest.fixture
def broken_acceptance(monkeypatch):
    _clear_compiled()  # the compiled acceptances trace accept_sampled anew
    monkeypatch.setattr(candidates, "accept_sampled", _always_accept_candidates)
    monkeypatch.setattr(exact, "accept_sampled", _always_accept_dense)
    yield
    monkeypatch.undo()
    _clear_compiled()


def _run(model, **kw):
    return V.verify(model, depth=3, replies=REPLIES, greedy_tokens=16, greedy_prompts=PROMPTS,
                    seed=1234, **kw)


def test_passes_on_the_engine(tiny_model):
    seen = []
    r = _run(tiny_model, progress=lambda d, t, m: seen.append((d, t)))
    assert r.passed, r.message
    assert all(c.identical for c in r.greedy) and r.replies == REPLIES
    assert r.p_value is not None and r.p_value > 0.05, r  # far above THRESHOLD = 0.001
    assert r.message.startswith("Speculation left the output unchanged")
    assert seen[-1][0] == seen[-1][1] == len(PROMPTS) + REPLIES
    assert r.to_dict()["passed"] is True


def test_fails_when_drafts_are_always_accepted(tiny_model, broken_acceptance):
    r = _run(tiny_model)
    assert not r.passed, r.message
    assert r.p_value is not None and r.p_value < V.THRESHOLD * 1e-3, r
    assert "CHANGED" in r.message and "DIFFER" in r.message


def test_cancel_gives_no_verdict(tiny_model):
    cancel = threading.Event()
    cancel.set()
    r = _run(tiny_model, cancel=cancel)
    assert r.cancelled and not r.passed and r.replies == 0


def test_depth_must_be_speculative(tiny_model):
    with pytest.raises(ValueError):
        V.verify(tiny_model, depth=0, replies=1)


def test_chi2_sf_matches_known_values():
    assert V.chi2_sf(0.0, 3) == 1.0
    assert math.isclose(V.chi2_sf(3.841458820694124, 1), 0.05, rel_tol=1e-9)
    assert math.isclose(V.chi2_sf(18.307038053275146, 10), 0.05, rel_tol=1e-9)
    assert math.isclose(V.chi2_sf(2.0, 2), math.exp(-1.0), rel_tol=1e-12)
    assert math.isclose(V.chi2_sf(29.5878, 10), 0.001, rel_tol=1e-3)
    scipy = pytest.importorskip("scipy.stats")
    for x, k in ((0.3, 1), (5.0, 4), (40.0, 7), (120.0, 90), (300.0, 200)):
        assert math.isclose(V.chi2_sf(x, k), scipy.chi2.sf(x, k), rel_tol=1e-9, abs_tol=1e-300)


def test_pooling_keeps_expected_counts_at_least_five():
    from collections import Counter

    a = Counter({1: 50, 2: 30, 3: 2, 4: 1, 5: 1})
    b = Counter({1: 48, 2: 33, 3: 1, 4: 2, 6: 2})
    cols = V.pooled(a, b)
    assert all((x + y) / 2 >= V.MIN_EXPECTED for x, y in cols)
    assert sum(x for x, _ in cols) == sum(a.values()) and sum(y for _, y in cols) == sum(b.values())
    assert V.homogeneity(Counter({1: 10}), Counter({1: 10}))[1] == 0  # one outcome: no test
