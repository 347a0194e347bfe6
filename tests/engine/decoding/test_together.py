"""Prompts admitted together prefill in one left-padded forward (``engine.decoding.together``).

Each row ends as the session it would be after prefilling alone (every cache, the last hidden
and logits, the MTP head's pairs, the prompt cache's checkpoint) up to float rounding; a burst
of chat requests runs one prefill forward and replies as each request alone; what cannot be
batched (a cached prefix, another checkpoint distance, past the budget, a cancelled request)
prefills alone; the GDN layers' padding leaves any state as it was.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.decoding import together
from engine.decoding.decoder import BatchDecoder
from engine.decoding.session import Session
from engine.models import trunk
from tests.engine.decoding.test_batching import DEMO, alone, batched
from tests.engine.decoding.test_decode import prompts

QUESTIONS = ["Write a python function that sorts a list.", "Explain json.dumps.",
             "What does os.path.join do?", "Write a stack class with push and pop.",
             "Explain recursion in two sentences, with one example."]
ATOL = 1e-4


@pytest.fixture(scope="module")
def demo_model():
    import engine

    return engine.load(DEMO)


def chats(model, n: int) -> list[list[int]]:
    return [model.chat_ids([{"role": "user", "content": q}], enable_thinking=False)
            for q in QUESTIONS[:n]]


def _kv(c) -> list[np.ndarray]:
    return [np.array(c.keys[..., :c.offset, :]), np.array(c.values[..., :c.offset, :])]


def session_arrays(s: Session) -> list[np.ndarray]:
    out = [np.array(s.last_logits), np.array(s.last_hidden)]
    for c in s.trunk_cache:
        out += _kv(c) if hasattr(c, "offset") else [np.array(a) for a in c.cache]
    for c in s.mtp_cache or []:
        out += _kv(c)
    return out


def snapshot_arrays(snap) -> list[np.ndarray]:
    out = [np.array(snap.last_hidden)]
    for state in (snap.trunk_state, snap.mtp_state or []):
        for t in state:
            out += [np.array(t[1][..., :t[3], :]), np.array(t[2][..., :t[3], :])] \
                if t[0] == "kv" else [np.array(a) for a in t[1]]
    return out


def _alone(model, p: list[int], back: int | None) -> Session:
    s = Session.fresh(model, use_mtp=True)
    for _ in s.prefill_chunks(p, mark=None if back is None else len(p) - back):
        pass
    return s


@pytest.mark.parametrize("which", ["demo chats", "tiny raw"])
def test_each_row_is_the_session_it_would_be_alone(which, demo_model, tiny_model):
    if which == "demo chats":
        model, ps = demo_model, chats(demo_model, 5)
        back = len(ps[0]) - carryover_of(model).checkpoint(model, ps[0])
    else:
        model, back = tiny_model, None
        ps = [p for p in prompts(12, seed=5) if len(p) >= 3][:5]
    lengths = {len(p) for p in ps}
    assert len(lengths) > 2, "rows of different lengths: real padding"
    assert together.supported(model, max(lengths))
    refs = [_alone(model, p, back) for p in ps]
    got = [Session.fresh(model, use_mtp=True) for _ in ps]
    together.prefill(model, got, ps, back)
    for p, a, b in zip(ps, refs, got, strict=True):
        assert b.fed == a.fed == p
        assert b.mtp_rows == a.mtp_rows == len(p) - 1 and b.pending_tok == a.pending_tok == []
        for x, y in zip(session_arrays(a), session_arrays(b), strict=True):
            assert x.shape == y.shape
            assert np.abs(x - y).max() < ATOL
        assert int(mx.argmax(a.last_logits)) == int(mx.argmax(b.last_logits))
        if back is None:
            assert b.marked is None
            continue
        assert b.marked.fed == a.marked.fed == tuple(p[:len(p) - back])
        assert b.marked.mtp_rows == a.marked.mtp_rows and b.marked.last_logits is None
        for x, y in zip(snapshot_arrays(a.marked), snapshot_arrays(b.marked), strict=True):
            assert x.shape == y.shape
            assert np.abs(x - y).max() < ATOL


def test_padding_leaves_a_gdn_state_as_it_was(tiny_model):
    """A left-padded row's GDN layer ends where its own tokens take it, with the same outputs
    for them: the padding feeds the conv zeros (a fresh row's conv window) and neither decays
    nor updates the recurrent state (any state passes through it)."""
    layer = next(layer for layer in tiny_model.text_model.model.layers if layer.is_linear)
    gdn = layer.linear_attn
    D = tiny_model.text_model.model.embed_tokens.weight.shape[1]
    mx.random.seed(3)
    x = mx.random.normal((1, 9, D))
    start = [mx.zeros((1, gdn.conv_kernel_size - 1, gdn.conv_dim)),
             0.1 * mx.random.normal((1, gdn.num_v_heads, gdn.head_v_dim, gdn.head_k_dim))]
    ref_cache = list(start)
    ref, _ = trunk.gdn_prefill(gdn, x, ref_cache)
    pad = 5
    padded = mx.concatenate([mx.random.normal((1, pad, D)), x], axis=1)
    mask = mx.arange(pad + 9)[None] >= pad
    cache = list(start)
    out, _ = trunk.gdn_prefill(gdn, padded, cache, mask=mask)
    assert np.abs(np.array(out[:, pad:]) - np.array(ref)).max() < ATOL
    for a, b in zip(cache, ref_cache, strict=True):
        assert np.abs(np.array(a) - np.array(b)).max() < ATOL
    # unmasked, the same padding changes the row's outputs: the mask is what keeps it out
    cache = list(start)
    out, _ = trunk.gdn_prefill(gdn, padded, cache)
    assert np.abs(np.array(out[:, pad:]) - np.array(ref)).max() > 1e-2
    # and from a fresh state the padding is all the row sees before its tokens
    ref_cache, cache = [None, None], [None, None]
    ref, _ = trunk.gdn_prefill(gdn, x, ref_cache)
    out, _ = trunk.gdn_prefill(gdn, padded, cache, mask=mask)
    assert np.abs(np.array(out[:, pad:]) - np.array(ref)).max() < ATOL
    for a, b in zip(cache, ref_cache, strict=True):
        assert np.abs(np.array(a) - np.array(b)).max() < ATOL


def _count_forwards(model, monkeypatch) -> list:
    shapes = []
    real = model.forward_hidden

    def counted(inputs, cache, **kw):
        shapes.append((tuple(inputs.shape), kw.get("capture", False)))
        return real(inputs, cache, **kw)
    monkeypatch.setattr(model, "forward_hidden", counted)
    return shapes


@pytest.mark.parametrize("depths", [(0, 0, 0, 0), (3, 3, 3, 3), ("auto", 2, 0, 3)],
                         ids=["depth 0", "depth 3", "mixed"])
def test_a_burst_prefills_in_one_forward_and_replies_as_alone(demo_model, monkeypatch,
                                                              depths):
    ps = chats(demo_model, 4)
    refs = [alone(demo_model, p, depth=d, max_tokens=24) for p, d in zip(ps, depths)]
    carryover_of(demo_model).reset_prompt_cache()
    shapes = _count_forwards(demo_model, monkeypatch)
    dec = BatchDecoder(demo_model, max_streams=4)
    streams = [dec.add(p, depth=d, max_tokens=24) for p, d in zip(ps, depths)]
    got = batched(dec, streams)
    prefills = [s for s, capture in shapes if not capture and s[1] > 1]
    assert prefills == [(4, max(len(p) for p in ps))]
    assert [got[s.id] for s in streams] == refs


def test_seeded_sampled_streams_prefilled_together_give_their_own_tokens(demo_model):
    """At fixed depths (an `auto` row's depths follow its batch's controller, so its keys
    split as they may not alone)."""
    params = SamplingParams(temperature=0.8, top_p=0.95)
    ps = chats(demo_model, 3)
    refs = [alone(demo_model, p, depth=d, max_tokens=20, sampling=params, seed=10 + i)
            for i, (p, d) in enumerate(zip(ps, [0, 3, 2]))]
    carryover_of(demo_model).reset_prompt_cache()
    dec = BatchDecoder(demo_model, max_streams=4)
    streams = [dec.add(p, depth=d, max_tokens=20, sampling=params, seed=10 + i)
               for i, (p, d) in enumerate(zip(ps, [0, 3, 2]))]
    got = batched(dec, streams)
    assert [got[s.id] for s in streams] == refs


def test_what_cannot_prefill_together_prefills_alone(demo_model, monkeypatch):
    """The line is cut at the first stream that does not qualify: one whose conversation is
    in the prompt cache (it resumes from it), one whose checkpoint lies elsewhere (a raw
    prompt), one past the step's budget, or beyond the free rows. Replies are unchanged and
    the cached one reuses its state. (The cached one is first in line: any admission's
    ``take`` drops the other conversations' states while one conversation is kept.)"""
    from engine.decoding import decoder as decoder_mod

    co = carryover_of(demo_model)
    ps = chats(demo_model, 5)
    co.reset_prompt_cache()
    first = alone(demo_model, ps[0], depth=2, max_tokens=8)
    follow = demo_model.chat_ids([{"role": "user", "content": QUESTIONS[0]},
                                  {"role": "assistant",
                                   "content": demo_model.tokenizer.decode(first)},
                                  {"role": "user", "content": "And in reverse?"}],
                                 enable_thinking=False)
    raw = demo_model.tokenizer.encode("def add(a, b):\n    return")
    line = [follow, ps[1], ps[2], raw, ps[3], ps[4]]
    refs = [alone(demo_model, p, depth=2, max_tokens=10) for p in line]
    co.reset_prompt_cache()
    alone(demo_model, ps[0], depth=2, max_tokens=8)  # the conversation `follow` continues
    shapes = _count_forwards(demo_model, monkeypatch)
    monkeypatch.setattr(decoder_mod, "PREFILL_BUDGET", 10_000)
    dec = BatchDecoder(demo_model, max_streams=8)
    streams = [dec.add(p, depth=2, max_tokens=10) for p in line]
    reused = {}
    got = {s.id: [] for s in streams}
    while dec.busy:
        for st, ev in dec.step():
            got[st.id].extend(ev.token_ids)
            if ev.prefill is not None:
                reused[st.id] = ev.prefill.reused_tokens
    assert [got[s.id] for s in streams] == refs
    assert reused[streams[0].id] > len(ps[0]) // 2  # resumed, not prefilled
    assert all(reused[s.id] == 0 for s in streams[1:])
    # `follow` alone (its new part), [1, 2] together, the raw prompt alone, [3, 4] together
    assert [s[0] for s, capture in shapes if not capture and s[1] > 1] == [1, 2, 1, 2]

    # past the budget, or with one row free: one at a time
    for budget, rows in ((len(ps[1]) + len(ps[2]) - 1, 4), (10_000, 1)):
        co.reset_prompt_cache()
        monkeypatch.setattr(decoder_mod, "PREFILL_BUDGET", budget)
        del shapes[:]
        dec = BatchDecoder(demo_model, max_streams=rows)
        streams = [dec.add(p, depth=2, max_tokens=10) for p in (ps[1], ps[2])]
        got = batched(dec, streams)
        assert [got[s.id] for s in streams] == refs[1:3]
        assert [s[0] for s, capture in shapes if not capture and s[1] > 1] == [1, 1]


def test_a_cancelled_request_is_left_out(demo_model):
    import threading

    ps = chats(demo_model, 3)
    refs = [alone(demo_model, p, depth=0, max_tokens=8) for p in ps]
    carryover_of(demo_model).reset_prompt_cache()
    dec = BatchDecoder(demo_model, max_streams=4)
    flag = threading.Event()
    streams = [dec.add(p, depth=0, max_tokens=8, cancel=flag if i == 1 else None)
               for i, p in enumerate(ps)]
    flag.set()
    got = batched(dec, streams)
    assert got[streams[1].id] == [] and streams[1].finished
    assert [got[streams[0].id], got[streams[2].id]] == [refs[0], refs[2]]


@pytest.mark.parametrize("together_", [True, False], ids=["one forward", "one each"])
def test_checkpoints_of_a_burst_serve_each_next_turn(demo_model, monkeypatch, together_):
    """Conversations admitted in one burst keep their checkpoints: each next turn resumes from
    its own conversation's state. (Admitted one at a time, the second request's ``take`` used
    to drop the first's: the prompt cache kept one conversation until the first had joined.)"""
    if not together_:
        monkeypatch.setattr(together, "MIN_ROWS", 99)
    co = carryover_of(demo_model)
    co.reset_prompt_cache()
    qs = QUESTIONS[:3]
    dec = BatchDecoder(demo_model, max_streams=4)
    first = [dec.add(p, depth=2, max_tokens=12) for p in chats(demo_model, 3)]
    got = batched(dec, first)
    follow = [demo_model.chat_ids([{"role": "user", "content": q},
                                   {"role": "assistant",
                                    "content": demo_model.tokenizer.decode(got[s.id])},
                                   {"role": "user", "content": "Shorter, please."}],
                                  enable_thinking=False) for q, s in zip(qs, first)]
    second = [dec.add(f, depth=2, max_tokens=10) for f in follow]
    reused = {}
    while dec.busy:
        for st, ev in dec.step():
            if ev.prefill is not None:
                reused[st.id] = ev.prefill.reused_tokens
    for s, p in zip(second, chats(demo_model, 3)):
        assert reused[s.id] == co.checkpoint(demo_model, p), (reused[s.id], len(p))
