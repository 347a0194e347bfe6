"""Exactness of speculative decoding: greedy equality, rollback, drafter acceptance, stops."""
from __future__ import annotations

import dataclasses
import threading

import mlx.core as mx
import numpy as np
import pytest

import engine
from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.decoding.drafters import DraftRequest, ReplayDrafter
from engine.decoding.session import Session
from engine.errors import GenerationError, PromptTooLongError
from engine.metrics.summary import ReplyTally
from engine.sampling import exact as sampling
from engine.sampling.candidates import Candidates
from tests.engine.reference import head_draft, plain_step


def run(model, prompt, *, depth, max_tokens=37, fresh=True, **kw) -> ReplyTally:
    if fresh:
        carryover_of(model).reset_prompt_cache()
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
    return head_draft(session, request).tokens


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
        snap = carryover_of(tiny_model).prompt_cache.snapshots[-1]
        live = Session.from_snapshot(tiny_model, snap, use_mtp=True)
        x_next = out.token_ids[len(live.fed) - len(p)] if len(live.fed) - len(p) < len(out.token_ids) else None
        assert tuple(live.fed) == tuple(p) + tuple(out.token_ids[: len(live.fed) - len(p)])
        if x_next is None:
            continue
        fresh_logits, fresh_draft = _fresh_logits_and_mtp(tiny_model, live.fed, x_next)
        want = np.array(fresh_logits)
        # float32 (eps 1.2e-7) rounding: a verify forward over k+1 tokens and a fresh prefill
        # sum the same products in other orders (OpenBLAS picks its kernels by shape), and
        # the differences grow with the logits' scale: 1.1e-4 at a logit of ~1.6 on one
        # machine, under 1e-4 on another. 2e-4 of the scale, as test_batching allows; a wrong
        # KV/GDN/conv state differs by O(scale) and changes the draft checked exactly below
        np.testing.assert_allclose(np.array(live.last_logits), want,
                                   atol=2e-4 * np.abs(want).max())
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
    carryover_of(tiny_model).reset_prompt_cache()
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
    snap = carryover_of(tiny_model).prompt_cache.snapshots[-1]
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
    carryover_of(tiny_model).reset_prompt_cache()
    first = run(tiny_model, p, depth=2, max_tokens=10, fresh=False)
    follow = p + first.token_ids + [7, 8, 9]
    events = list(tiny_model.generate(follow, max_tokens=10, depth=2))
    pre = events[0].prefill
    assert pre.reused_tokens >= len(p) + len(first.token_ids) - 1
    ref = run(tiny_model, follow, depth=0, max_tokens=10)
    assert [t for e in events for t in e.token_ids] == ref.token_ids
    # regenerate: same prompt reuses the prompt snapshot
    carryover_of(tiny_model).reset_prompt_cache()
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
    import engine.decoding.session as sess

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


def _mtp_invariant_holds(snap) -> bool:
    """One MTP row per committed pair (pending ones counted), and the cache agrees."""
    return (snap.mtp_rows + len(snap.pending_tok) == len(snap.fed) - 1
            and snap.mtp_state[0][3] == snap.mtp_rows)


@pytest.mark.parametrize("after", [1, 2, 5])
def test_closing_the_generator_mid_reply_undoes_the_inflight_draft(tiny_model, after):
    """A consumer that stops reading (GeneratorExit) leaves the caches whole: the draft
    launched before the last event was handed out is undone, and the next turn resumes
    exactly from the state kept."""
    p = prompts(1, seed=15)[0]
    carryover_of(tiny_model).reset_prompt_cache()
    gen = tiny_model.generate(p, max_tokens=200, depth=3)
    seen = [next(gen) for _ in range(after)]
    assert all(ev.finish_reason is None for ev in seen)
    gen.close()
    snap = carryover_of(tiny_model).prompt_cache.snapshots[-1]
    assert len(snap.fed) > len(p) or after == 1
    assert _mtp_invariant_holds(snap)
    follow = list(snap.fed) + [11, 12]
    resumed = list(tiny_model.generate(follow, max_tokens=12, depth=3))
    assert resumed[0].prefill.reused_tokens == len(snap.fed)
    fresh = run(tiny_model, follow, depth=0, max_tokens=12)
    assert [t for e in resumed for t in e.token_ids] == fresh.token_ids


def test_cancel_leaves_the_mtp_invariant(tiny_model):
    p = prompts(1, seed=16)[0]
    cancel = threading.Event()
    carryover_of(tiny_model).reset_prompt_cache()
    for i, _ in enumerate(tiny_model.generate(p, max_tokens=200, depth=4, cancel=cancel)):
        if i == 1:
            cancel.set()
    assert _mtp_invariant_holds(carryover_of(tiny_model).prompt_cache.snapshots[-1])


@pytest.mark.parametrize("mode", ["filtered", "softmax", "argmax"])
def test_draft_modes_draw_from_the_q_they_report(tiny_model, mode):
    """Exactness needs only that each draft comes from the q acceptance is given (MTP_SPEC
    §5; proved for any q in test_acceptance_enumeration): "argmax" drafts the head's top token
    and reports q as one-hot (None); the others report proper distributions that hold their
    drafts."""
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, presence_penalty=0.4)
    s = Session.fresh(tiny_model, use_mtp=True)
    s.prefill(prompts(1, seed=17)[0])
    counts = mx.zeros((tiny_model.info.vocab_size,))
    request = DraftRequest(x0=5, k=3, generated=(5,), params=params, counts=counts,
                           key=sampling.make_key(3))
    proposal = head_draft(s, request, mode)
    drafts = proposal.tokens.tolist()
    assert len(drafts) == 3
    if mode == "argmax":
        assert proposal.q is None
        return
    q = proposal.q
    if mode == "filtered":  # top-k drafts report the compact form (engine.sampling.candidates)
        assert isinstance(q, Candidates) and q.ids.shape == (3, 5)
        q = q.dense(tiny_model.info.vocab_size)
    q = np.array(q)
    assert q.shape == (3, tiny_model.info.vocab_size)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-5)
    assert all(q[j, d] > 0 for j, d in enumerate(drafts))
    kept = (q > 0).sum(axis=1)
    assert (kept <= 5).all() if mode == "filtered" else (kept > 5).all()


@pytest.mark.parametrize("mode", ["filtered", "softmax", "argmax"])
def test_every_draft_mode_is_exact_in_greedy_and_reproducible_sampled(tiny_model, mode):
    for p in prompts(4, seed=18):
        assert (run(tiny_model, p, depth=3, draft_mode=mode).token_ids
                == run(tiny_model, p, depth=0).token_ids)
    sp = SamplingParams(temperature=0.9, top_k=20)
    p = prompts(1, seed=19)[0]
    assert (run(tiny_model, p, depth=2, sampling=sp, seed=5, draft_mode=mode).token_ids
            == run(tiny_model, p, depth=2, sampling=sp, seed=5, draft_mode=mode).token_ids)
    with pytest.raises(GenerationError, match="draft_mode"):
        tiny_model.generate(p, depth=2, draft_mode="beam")


def test_plain_cycles_put_the_read_wait_in_t_sync(tiny_model):
    p = prompts(1, seed=20)[0]
    cycles = run(tiny_model, p, depth=0, max_tokens=8).cycles
    assert cycles and all(c.t_sync > 0 and c.host_syncs == 1 for c in cycles)
    for c in cycles:
        assert c.t_verify + c.t_sync <= c.t_total + 1e-9


@pytest.mark.parametrize("profile", [False, True])
def test_speculative_cycle_times(tiny_model, profile):
    """Unprofiled: the single sync's wait is t_sync; profiled: per-phase evals, t_sync 0."""
    p = prompts(1, seed=21)[0]
    cycles = run(tiny_model, p, depth=2, max_tokens=12, profile=profile).cycles
    assert cycles
    for c in cycles:
        parts = c.t_draft + c.t_verify + c.t_accept + c.t_commit + c.t_sync
        assert parts <= c.t_total + 1e-9
        assert c.host_syncs == (4 if profile else 1)
        assert (c.t_sync == 0.0) if profile else (c.t_sync > 0.0)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("S", [2, 3, 5])
def test_fused_gdn_capture_is_bit_identical(tiny_model, S, rows):
    """The compiled verify-forward GDN layer (CPU; one row or a batch's) gives the uncompiled
    layer's output and every captured conv window and recurrent state bit for bit."""
    from engine.models import trunk

    s = Session.fresh(tiny_model, use_mtp=True)
    s.prefill(list(range(3, 40)))
    layer = next(i for i, c in enumerate(s.trunk_cache) if isinstance(c, list) or
                 type(c).__name__ == "ArraysCache")
    gdn = tiny_model.text_model.model.layers[layer].linear_attn
    c = s.trunk_cache[layer]
    x = mx.random.normal((rows, S, tiny_model.text_model.args.hidden_size),
                         key=mx.random.key(S))
    if rows > 1:  # a batch's rows: each its own state
        c = [mx.concatenate([c[0] * (1 + i) for i in range(rows)]),
             mx.concatenate([c[1] * (1 - 0.1 * i) for i in range(rows)])]
    ref_cache, got_cache = [c[0], c[1]], [c[0], c[1]]
    ref, ref_cap = trunk._gdn_capture(gdn, x, ref_cache)
    got, got_cap = trunk._gdn_capture_fused(gdn, x, got_cache)
    assert gdn.__dict__.get("_mtpchat_capture"), "the fused path did not run"
    pairs = [(ref, got)] + list(zip(ref_cap.conv + ref_cap.state, got_cap.conv + got_cap.state))
    pairs += list(zip(ref_cache, got_cache))
    for a, b in pairs:
        assert np.array_equal(np.array(a), np.array(b))


def test_fused_gdn_capture_sees_new_weights(tiny_model):
    """Weights changed in place after the fused layer was compiled are the ones it uses."""
    from engine.models import trunk

    s = Session.fresh(tiny_model, use_mtp=True)
    s.prefill(list(range(3, 20)))
    layer = next(i for i, c in enumerate(s.trunk_cache) if type(c).__name__ == "ArraysCache")
    gdn = tiny_model.text_model.model.layers[layer].linear_attn
    c = s.trunk_cache[layer]
    x = mx.random.normal((1, 3, tiny_model.text_model.args.hidden_size), key=mx.random.key(1))
    before, _ = trunk._gdn_capture_fused(gdn, x, [c[0], c[1]])
    old = gdn.out_proj.weight
    try:
        gdn.out_proj.weight = old * 2
        after, _ = trunk._gdn_capture_fused(gdn, x, [c[0], c[1]])
        ref, _ = trunk._gdn_capture(gdn, x, [c[0], c[1]])
    finally:
        gdn.out_proj.weight = old
    np.testing.assert_allclose(np.array(after), np.array(ref), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.array(after), np.array(before), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("which", ["dense", "moe", "dense-bf16"])
def test_plain_step_is_mlx_lms_layer_to_float_rounding(which, tiny_model, tmp_path_factory):
    """A depth-0 step (the engine's trunk forward: compiled GDN, attention and MLP parts) gives
    the logits and caches mlx-lm's own model call gives, step after step: within float
    rounding (``_rounding_apart``: the CPU attention's folded heads and its own exponential,
    engine/models/cpu_attention.py; the GDN parts alone are bit for bit,
    ``test_fused_gdn_capture_is_bit_identical``)."""
    from engine.models.model import load
    from tests.tinymodels import build_tiny_model

    model = tiny_model if which == "dense" else load(
        build_tiny_model(tmp_path_factory.mktemp("moe") / "m", seed=5, moe=True)) \
        if which == "moe" else load(tiny_model.info.path, dtype="bfloat16")
    ours, ref = Session.fresh(model, use_mtp=False), Session.fresh(model, use_mtp=False)
    for s in (ours, ref):
        s.prefill(list(range(3, 30)))
    tok = 5
    for _ in range(6):
        got = plain_step(ours, tok)
        want = model.trunk(mx.array([[tok]]), cache=ref.trunk_cache)[:, -1]
        assert got.dtype == want.dtype
        _rounding_apart(got, want)
        tok = int(mx.argmax(want).item())
    from mlx.utils import tree_flatten

    mine = tree_flatten([c.state for c in ours.trunk_cache])
    theirs = tree_flatten([c.state for c in ref.trunk_cache])
    assert len(mine) == len(theirs) > 0
    for (_, x), (_, y) in zip(mine, theirs):
        if not isinstance(x, mx.array):
            assert x == y
            continue
        _rounding_apart(x, y)


def _rounding_apart(a: mx.array, b: mx.array) -> None:
    """``a`` equals ``b`` to a few roundings of their dtype (scaled by ``b``'s largest)."""
    tol = 1e-5 if a.dtype == mx.float32 else 2e-2
    a, b = np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


def test_compiled_attention_layer_sees_new_weights(tiny_model):
    """A full-attention layer, compiled in two parts around its cache update, uses weights
    changed in place after it was compiled (here ``q_proj``'s, ``o_proj``'s and the MLP's),
    and equals mlx-lm's layer with them (to float rounding: the CPU branch's attention folds
    the query heads onto their key/value heads, engine/models/cpu_attention.py)."""
    from mlx_lm.models.cache import KVCache

    from engine.models import trunk

    layer = next(x for x in tiny_model.text_model.model.layers if not x.is_linear)
    h = mx.random.normal((1, 3, tiny_model.text_model.args.hidden_size), key=mx.random.key(4))

    def both():
        mine, ref = KVCache(), KVCache()
        for c in (mine, ref):  # some context first: a RoPE offset that is not 0
            c.update_and_fetch(*[mx.random.normal((1, layer.self_attn.num_key_value_heads, 5,
                                                   layer.self_attn.head_dim),
                                                  key=mx.random.key(k)) for k in (5, 6)])
        got = trunk.attention_layer(layer, h, "causal", mine)
        want = layer(h, "causal", ref)  # mlx-lm's decoder layer
        return got, want

    before, _ = both()
    attn, mlp = layer.self_attn, layer.mlp
    old = attn.q_proj.weight, attn.o_proj.weight, mlp.down_proj.weight
    try:
        attn.q_proj.weight, attn.o_proj.weight, mlp.down_proj.weight = (w * 2 for w in old)
        after, ref = both()
    finally:
        attn.q_proj.weight, attn.o_proj.weight, mlp.down_proj.weight = old
    assert "_mtpchat_attn_in" in layer.__dict__ and "_mtpchat_attn_out" in layer.__dict__
    np.testing.assert_allclose(np.array(after), np.array(ref), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.array(after), np.array(before), rtol=1e-3, atol=1e-3)


def test_compiled_linear_layer_is_mlx_lms_and_sees_new_weights(tiny_model):
    """A Gated DeltaNet layer compiled whole gives mlx-lm's decoder layer's output and cache,
    and the parts' (``_gdn_capture`` then the MLP half) per-step states, bit for bit, over 1
    and 3 tokens; weights changed in place after it was compiled are the ones it uses."""
    from mlx_lm.models.cache import ArraysCache

    from engine.models import trunk

    layer = next(x for x in tiny_model.text_model.model.layers if x.is_linear)
    gdn = layer.linear_attn
    H = tiny_model.text_model.args.hidden_size
    conv = mx.random.normal((1, gdn.conv_kernel_size - 1, gdn.conv_dim), key=mx.random.key(7))
    state = mx.random.normal((1, gdn.num_v_heads, gdn.head_v_dim, gdn.head_k_dim),
                             key=mx.random.key(8)) * 0.1

    def check(S):
        x = mx.random.normal((1, S, H), key=mx.random.key(9 + S))
        mine = ArraysCache(size=2)
        mine[0], mine[1] = conv, state
        got, cap = trunk.linear_layer(layer, x, mine)
        ref = ArraysCache(size=2)
        ref[0], ref[1] = conv, state
        want = layer(x, mask=None, cache=ref)
        parts = [conv, state]
        r, pcap = trunk._gdn_capture(gdn, layer.input_layernorm(x), parts)
        h = x + r
        assert np.array_equal(np.array(got), np.array(want))
        assert np.array_equal(np.array(got), np.array(h + layer.mlp(
            layer.post_attention_layernorm(h))))
        for a, b in zip(cap.state + cap.conv + [mine[0], mine[1]],
                        pcap.state + pcap.conv + [ref[0], ref[1]]):
            assert np.array_equal(np.array(a), np.array(b))
        return got

    for S in (1, 3):
        before = check(S)
    old = layer.mlp.down_proj.weight, gdn.out_proj.weight
    try:
        layer.mlp.down_proj.weight, gdn.out_proj.weight = (w * 2 for w in old)
        after = check(3)
    finally:
        layer.mlp.down_proj.weight, gdn.out_proj.weight = old
    assert layer.__dict__.get("_mtpchat_layer"), "the compiled path did not run"
    assert not np.array_equal(np.array(after), np.array(before))


def test_a_models_layers_share_one_trace_per_shape_each_on_its_own_weights(tiny_dir):
    """The trunk's layers are one share group (``trunk.share_compiled``): a new input shape is
    traced once for all GDN layers (and once for all attention layers), and each layer's call
    replays that trace on its OWN weights: every layer equals mlx-lm's decoder layer bit for
    bit, over 1 and 3 tokens. A second model never shares the first one's traces."""
    from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache

    from engine.models import trunk

    model = engine.load(tiny_dir)  # a model of its own: no trace from another test
    text = model.text_model
    inner = text.model
    H = text.args.hidden_size
    trunk.forward_hidden(text, mx.array([[1, 2, 3]]), make_prompt_cache(model.trunk))
    group = inner.__dict__["_mtpchat_group"]
    linear = [x for x in inner.layers if x.is_linear]
    full = [x for x in inner.layers if not x.is_linear]
    assert len(linear) >= 2 and full
    for S in (1, 3):
        x = mx.random.normal((1, S, H), key=mx.random.key(20 + S))
        for i, layer in enumerate(linear):
            gdn = layer.linear_attn
            conv = mx.random.normal((1, gdn.conv_kernel_size - 1, gdn.conv_dim),
                                    key=mx.random.key(30 + i))
            state = mx.random.normal((1, gdn.num_v_heads, gdn.head_v_dim, gdn.head_k_dim),
                                     key=mx.random.key(40 + i)) * 0.1
            mine, ref = ArraysCache(size=2), ArraysCache(size=2)
            mine[0], mine[1] = conv, state
            ref[0], ref[1] = conv, state
            got, _ = trunk.linear_layer(layer, x, mine, cpu=True)
            want = layer(x, mask=None, cache=ref)
            assert np.array_equal(np.array(got), np.array(want)), (S, i)
            assert np.array_equal(np.array(mine[1]), np.array(ref[1])), (S, i)
        for i, layer in enumerate(full):
            mine, ref = KVCache(), KVCache()
            got = trunk.attention_layer(layer, x, "causal" if S > 1 else None, mine, cpu=True)
            want = layer(x, "causal" if S > 1 else None, ref)
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    tables = {id(x.__dict__["_mtpchat_layer"]) for x in linear}
    assert len(tables) == 1  # one table of traces for every GDN layer
    shapes = next(iter(x.__dict__["_mtpchat_layer"] for x in linear))
    assert {k[0] for k in shapes} >= {(1, 1, H), (1, 3, H)}
    assert len([k for k in group if k[0] == "_mtpchat_attn_in"]) == 1
    other = engine.load(tiny_dir)
    trunk.forward_hidden(other.text_model, mx.array([[1, 2]]), make_prompt_cache(other.trunk))
    assert other.text_model.model.__dict__["_mtpchat_group"] is not group


def test_compiled_mlp_half_sees_new_weights(tiny_model):
    """Weights changed in place after a layer's MLP half was compiled are the ones it uses."""
    from engine.models import trunk

    layer = tiny_model.text_model.model.layers[0]
    h = mx.random.normal((1, 2, tiny_model.text_model.args.hidden_size), key=mx.random.key(2))
    before = trunk.mlp_block(layer, h)
    old = layer.mlp.down_proj.weight
    try:
        layer.mlp.down_proj.weight = old * 2
        after = trunk.mlp_block(layer, h)
        ref = h + layer.mlp(layer.post_attention_layernorm(h))
    finally:
        layer.mlp.down_proj.weight = old
    assert layer.__dict__.get("_mtpchat_mlp") is not None, "the compiled path did not run"
    np.testing.assert_allclose(np.array(after), np.array(ref), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.array(after), np.array(before), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_mtp_head_equals_mlx_lms_layer(tiny_model, dtype):
    """The MTP head with its input half and MLP half compiled gives what mlx-lm's decoder
    layer on the uncompiled ``fc`` gives, call after call (its KV cache growing): to float
    rounding (the CPU attention, ``_rounding_apart``)."""
    from mlx_lm.models.base import create_attention_mask

    from engine.models.model import load

    model = tiny_model if dtype == "float32" else load(tiny_model.info.path, dtype=dtype)
    head, H = model.mtp, model.text_model.args.hidden_size
    ours, ref = head.make_cache(), head.make_cache()
    for S, seed in ((3, 1), (1, 2), (2, 3)):
        h = mx.random.normal((1, S, H), key=mx.random.key(seed)).astype(head.fc.weight.dtype)
        e = mx.random.normal((1, S, H), key=mx.random.key(seed + 9)).astype(h.dtype)
        got = head(h, e, ours)
        z = head.fc(mx.concatenate([head.pre_fc_norm_embedding(e), head.pre_fc_norm_hidden(h)],
                                   axis=-1))
        mask = create_attention_mask(z, ref[0])
        for layer, c in zip(head.layers, ref):
            z = layer(z, mask=mask, cache=c)
        want = head.norm(z)
        assert head.__dict__.get("_mtpchat_fc") is not None
        _rounding_apart(got, want)
