"""Exactness of speculative decoding: greedy equality, rollback, drafter acceptance, stops."""
from __future__ import annotations

import dataclasses
import threading

import mlx.core as mx
import numpy as np
import pytest

import engine
from engine import SamplingParams
from engine import sampling
from engine.drafters import DraftRequest, MTPDrafter, ReplayDrafter
from engine.errors import GenerationError, PromptTooLongError
from engine.session import Session
from engine.summary import ReplyTally


def run(model, prompt, *, depth, max_tokens=37, fresh=True, **kw) -> ReplyTally:
    if fresh:
        model.reset_prompt_cache()
    s = ReplyTally()
    for ev in model.generate(prompt, max_tokens=max_tokens, depth=depth, **kw):
        s.add(ev)
    return s


def prompts(n=20, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 380, size=int(rng.integers(2, 40))).tolist() for _ in range(n)]


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_greedy_mtp_equals_plain(tiny_model, depth):
    for p in prompts():
        base = run(tiny_model, p, depth=0)
        spec = run(tiny_model, p, depth=depth)
        assert spec.token_ids == base.token_ids
        assert spec.finish_reason == base.finish_reason
        assert len(spec.token_ids) == 37 or spec.finish_reason == "stop"


def test_greedy_exact_across_eos(tiny_model):
    """Pick a token from the middle of each plain output as EOS: every depth stops there."""
    crossed = 0
    for p in prompts(12, seed=1):
        base = run(tiny_model, p, depth=0, max_tokens=30).token_ids
        eos_tok = base[len(base) // 2]
        m = engine.Model(trunk=tiny_model.trunk, mtp=tiny_model.mtp, tokenizer=tiny_model.tokenizer,
                         info=dataclasses.replace(tiny_model.info, eos_token_ids=(eos_tok,)))
        ref = run(m, p, depth=0, max_tokens=30)
        assert ref.finish_reason == "stop" and ref.token_ids[-1] == eos_tok
        for d in (1, 2, 3, 4):
            out = run(m, p, depth=d, max_tokens=30)
            assert out.token_ids == ref.token_ids and out.finish_reason == "stop"
        # with a replay drafter the EOS arrives as an accepted draft mid-cycle
        out = run(m, p, depth=4, max_tokens=30, drafter=ReplayDrafter(base))
        assert out.token_ids == ref.token_ids
        crossed += 1
    assert crossed == 12


def test_replay_of_target_argmax_is_always_accepted(tiny_model):
    for p in prompts(5, seed=2):
        base = run(tiny_model, p, depth=0, max_tokens=41)
        for d in (1, 3, 6):
            out = run(tiny_model, p, depth=d, max_tokens=41, drafter=ReplayDrafter(base.token_ids))
            assert out.token_ids == base.token_ids
            for c in out.cycles:
                assert c.accepted == c.depth, c
                assert c.extra_kind in ("bonus", "none")


def draft_one(session, x_next):
    """The MTP head's greedy draft after ``x_next`` (one step)."""
    request = DraftRequest(x0=x_next, k=1, generated=(), params=SamplingParams(), counts=None,
                           key=sampling.make_key(0))
    return MTPDrafter(session).draft(request).tokens


def _fresh_logits_and_mtp(model, fed, x_next):
    """Plain re-computation over ``fed``: next-step trunk logits, and the MTP logits of the
    pair (h_last, x_next) from a freshly built MTP cache."""
    s = Session.fresh(model, use_mtp=True)
    s.prefill(list(fed))
    return s.last_logits, draft_one(s, x_next)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_rollback_state_matches_fresh_decode(tiny_model, depth):
    """After every commit the next-step logits (attention KV, GDN state, conv window) and the
    MTP cache equal a fresh decode over the same committed tokens."""
    p = prompts(1, seed=5)[0]
    for max_tokens in range(2, 16, 3):
        out = run(tiny_model, p, depth=depth, max_tokens=max_tokens)
        snap = tiny_model.prompt_cache.snapshots[-1]
        live = Session.from_snapshot(tiny_model, snap, use_mtp=True)
        x_next = out.token_ids[len(live.fed) - len(p)] if len(live.fed) - len(p) < len(out.token_ids) else None
        assert tuple(live.fed) == tuple(p) + tuple(out.token_ids[: len(live.fed) - len(p)])
        if x_next is None:
            continue
        fresh_logits, fresh_draft = _fresh_logits_and_mtp(tiny_model, live.fed, x_next)
        np.testing.assert_allclose(np.array(live.last_logits), np.array(fresh_logits), atol=1e-4)
        live_draft = draft_one(live, x_next)
        assert live_draft.tolist() == fresh_draft.tolist()
        assert live.mtp_rows == len(live.fed)  # one row per committed pair + step-1 + probe


def test_sampled_is_reproducible_with_seed(tiny_model):
    p = prompts(1, seed=7)[0]
    sp = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, presence_penalty=0.3,
                        frequency_penalty=0.2)
    a = run(tiny_model, p, depth=2, sampling=sp, seed=11)
    b = run(tiny_model, p, depth=2, sampling=sp, seed=11)
    c = run(tiny_model, p, depth=2, sampling=sp, seed=12)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_cancel_stops_within_a_cycle_and_model_stays_usable(tiny_model):
    p = prompts(1, seed=8)[0]
    cancel = threading.Event()
    tiny_model.reset_prompt_cache()
    seen = 0
    reasons = []
    for ev in tiny_model.generate(p, max_tokens=200, depth=2, cancel=cancel):
        seen += 1
        if seen == 3:
            cancel.set()
        reasons.append(ev.finish_reason)
    assert reasons[-1] == "cancelled"
    assert seen == 4
    # the state kept after a cancel (a draft was in flight) resumes exactly
    snap = tiny_model.prompt_cache.snapshots[-1]
    # MTP invariant: one row per committed pair; the abandoned draft's rows are gone
    assert snap.mtp_rows + len(snap.pending_tok) == len(snap.fed) - 1
    assert snap.mtp_state[0][3] == snap.mtp_rows
    follow = list(snap.fed) + [11, 12]
    resumed = list(tiny_model.generate(follow, max_tokens=12, depth=2))
    assert resumed[0].prefill.reused_tokens == len(snap.fed)
    fresh = run(tiny_model, follow, depth=0, max_tokens=12)
    assert [t for e in resumed for t in e.token_ids] == fresh.token_ids
    assert run(tiny_model, p, depth=2).token_ids == run(tiny_model, p, depth=0).token_ids


def test_prompt_cache_reuses_previous_turn(tiny_model):
    p = prompts(1, seed=9)[0]
    tiny_model.reset_prompt_cache()
    first = run(tiny_model, p, depth=2, max_tokens=10, fresh=False)
    follow = p + first.token_ids + [7, 8, 9]
    events = list(tiny_model.generate(follow, max_tokens=10, depth=2))
    pre = events[0].prefill
    assert pre.reused_tokens >= len(p) + len(first.token_ids) - 1
    ref = run(tiny_model, follow, depth=0, max_tokens=10)
    assert [t for e in events for t in e.token_ids] == ref.token_ids
    # regenerate: same prompt reuses the prompt snapshot
    tiny_model.reset_prompt_cache()
    run(tiny_model, p, depth=1, max_tokens=5, fresh=False)
    again = list(tiny_model.generate(p, max_tokens=5, depth=1))
    assert again[0].prefill.reused_tokens == len(p)


def test_stop_strings_and_errors(tiny_model):
    p = prompts(1, seed=10)[0]
    full = run(tiny_model, p, depth=0, max_tokens=30)
    stop = full.text[10:13]
    assert stop
    out = run(tiny_model, p, depth=2, max_tokens=30, stop_strings=(stop,))
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.find(stop)]
    with pytest.raises(PromptTooLongError):
        run(tiny_model, [5] * (tiny_model.info.context_length + 1), depth=0)
    with pytest.raises(GenerationError):
        run(tiny_model, p, depth=9)
    with pytest.raises(GenerationError):
        run(tiny_model, [], depth=0)


def test_auto_depth_is_exact(tiny_model):
    for p in prompts(6, seed=12):
        assert run(tiny_model, p, depth="auto").token_ids == run(tiny_model, p, depth=0).token_ids


def test_chunked_prefill_matches_single_pass(tiny_model, monkeypatch):
    import engine.session as sess

    p = prompts(1, seed=13)[0] * 5
    ref = run(tiny_model, p, depth=2, max_tokens=12)
    monkeypatch.setattr(sess, "PREFILL_CHUNK", 7)
    out = run(tiny_model, p, depth=2, max_tokens=12)
    assert out.token_ids == ref.token_ids


def test_memory_does_not_grow_across_cycles(tiny_model):
    """Captured GDN states are released every cycle: active memory stays flat apart from the
    attention KV growth (a few KiB per token on the tiny model)."""
    p = prompts(1, seed=14)[0]
    m = engine.Model(trunk=tiny_model.trunk, mtp=tiny_model.mtp, tokenizer=tiny_model.tokenizer,
                     info=dataclasses.replace(tiny_model.info, eos_token_ids=()))
    mx.clear_cache()
    samples = []
    for ev in m.generate(p, max_tokens=300, depth=3):
        if ev.stats is not None:
            samples.append((ev.stats.context_tokens, mx.get_active_memory()))
    assert len(samples) > 50
    (c0, m0), (c1, m1) = samples[10], samples[-1]
    kv_bytes_per_token = 2 * 2 * 16 * 4 * 2  # K+V, kv heads, head_dim, fp32, attention layers(+MTP)
    allowance = (c1 - c0) * kv_bytes_per_token * 4 + 512 * 1024  # slab growth + slack
    assert m1 - m0 < allowance, (m0, m1, c0, c1)
