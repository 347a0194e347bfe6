"""Batched multi-stream MTP decoding (``engine.decoding``): every stream exactly as alone.

Greedy streams at mixed depths equal their single-stream output (streams that finish early,
join late or are cancelled included) on tiny dense and MoE models of the real layout and on
the demo model; seeded sampled streams give the same tokens batched and alone; batched depth-2
sampling follows plain decoding's distribution (chi-square); after every batched commit each
row's state equals a fresh single-stream decode over its committed tokens; memory stays flat
across many joins and leaves.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import engine
from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.decoding.decoder import BatchDecoder
from engine.decoding.drafters import ReplayDrafter
from engine.decoding.session import Session
from engine.errors import GenerationError
from tests.engine.decoding.test_decode import draft_one, prompts
from tests.tinymodels import build_tiny_model

DEPTHS = [0, 1, 3, "auto", 2, 0, 3, 1]
BUDGETS = [37, 9, 37, 30, 4, 37, 25, 37]  # some streams finish early
DEMO = Path(__file__).resolve().parents[3] / "resources" / "models" / "mtp-demo-qwen3_5"


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return engine.load(build_tiny_model(tmp_path_factory.mktemp("moe") / "m", seed=4, moe=True))


@pytest.fixture(scope="module")
def demo_model():
    return engine.load(DEMO)


def same_weights(model, **info) -> engine.Model:
    """Another ``Model`` on ``model``'s weights: its own prompt cache and depth controllers,
    ``info`` fields replaced (e.g. ``eos_token_ids=()``: streams that never stop early)."""
    return engine.Model(trunk=model.trunk, mtp=model.mtp, tokenizer=model.tokenizer,
                        info=dataclasses.replace(model.info, **info))


def alone(model, prompt, *, depth, max_tokens, **kw) -> list[int]:
    carryover_of(model).reset_prompt_cache()
    out = []
    for ev in model.generate(prompt, max_tokens=max_tokens, depth=depth, **kw):
        out.extend(ev.token_ids)
    return out


def batched(dec: BatchDecoder, streams, *, on_step=None) -> dict[str, list[int]]:
    got = {s.id: [] for s in streams}
    reasons = {}
    while dec.busy:
        for st, ev in dec.step():
            got.setdefault(st.id, []).extend(ev.token_ids)
            if ev.finish_reason:
                reasons[st.id] = ev.finish_reason
        if on_step is not None:
            on_step(dec)
    assert set(reasons) == set(got), "every stream ends with a finish reason"
    return got


def assert_exact_and_row_independent(model, ps, *, seed: int, max_tokens: int = 30) -> None:
    """Greedy depth 3 equals depth 0 on each prompt, and seeded sampled streams give the same
    tokens batched together as alone (what a row drafts depends on its own state only)."""
    for p in ps:
        assert alone(model, p, depth=3, max_tokens=max_tokens) == \
            alone(model, p, depth=0, max_tokens=max_tokens)
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.95)
    refs = [alone(model, p, depth=3, max_tokens=max_tokens, sampling=params, seed=seed + i)
            for i, p in enumerate(ps)]
    carryover_of(model).reset_prompt_cache()
    dec = BatchDecoder(model, max_streams=len(ps))
    streams = [dec.add(p, depth=3, max_tokens=max_tokens, sampling=params, seed=seed + i)
               for i, p in enumerate(ps)]
    got = batched(dec, streams)
    for s, ref in zip(streams, refs):
        assert got[s.id] == ref
    # the batch raised the shared model's prompt cache to one conversation per stream: back
    # to one, as the tests after this expect
    carryover_of(model).reset_prompt_cache()


def run_reused(dec: BatchDecoder) -> dict[str, int]:
    """Run ``dec`` to the end; each stream's prompt tokens reused from the prompt cache."""
    reused = {}
    while dec.busy:
        for st, ev in dec.step():
            if ev.prefill is not None:
                reused[st.id] = ev.prefill.reused_tokens
    return reused


def _demo_prompts(model, n):
    texts = ["Write a python function that sorts a list.", "Explain json.dumps.",
             "def hello(name):", "What does os.path.join do?", "Write a stack class.",
             "Explain recursion.", "import json\n", "List three sorting algorithms."]
    return [model.chat_ids([{"role": "user", "content": t}], enable_thinking=False)
            for t in texts[:n]]


@pytest.mark.parametrize("which", ["dense", "moe", "demo"])
def test_greedy_batch_equals_each_stream_alone(which, tiny_model, moe_model, demo_model):
    model = {"dense": tiny_model, "moe": moe_model, "demo": demo_model}[which]
    ps = _demo_prompts(model, 8) if which == "demo" else prompts(8, seed=31)
    refs = [alone(model, p, depth=d, max_tokens=n) for p, d, n in zip(ps, DEPTHS, BUDGETS)]
    carryover_of(model).reset_prompt_cache()
    dec = BatchDecoder(model, max_streams=8)
    streams = [dec.add(p, depth=d, max_tokens=n) for p, d, n in zip(ps, DEPTHS, BUDGETS)]
    got = batched(dec, streams)
    for s, ref, d in zip(streams, refs, DEPTHS):
        assert got[s.id] == ref, (which, d)
    assert dec.cycles < sum(len(r) for r in refs)  # rows really shared cycles


def test_streams_join_late_and_cancel_mid_batch(tiny_model):
    """Streams added while others run, more streams than rows (a queue), and one cancelled
    after a few cycles: the others are undisturbed, the cancelled one ends 'cancelled'."""
    ps = prompts(8, seed=32)
    refs = [alone(tiny_model, p, depth=d, max_tokens=37) for p, d in zip(ps, DEPTHS)]
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=3)
    cancel = threading.Event()
    streams = [dec.add(ps[0], depth=DEPTHS[0], max_tokens=37),
               dec.add(ps[1], depth=DEPTHS[1], max_tokens=37, cancel=cancel)]
    got = {s.id: [] for s in streams}
    ends = {}
    step = 0
    while dec.busy or len(streams) < 8:
        if step % 3 == 2 and len(streams) < 8:  # join late, between cycles
            i = len(streams)
            streams.append(dec.add(ps[i], depth=DEPTHS[i], max_tokens=37))
            got[streams[-1].id] = []
        if step == 4:
            cancel.set()
        for st, ev in dec.step():
            got[st.id].extend(ev.token_ids)
            if ev.finish_reason:
                ends[st.id] = ev.finish_reason
        step += 1
    assert ends[streams[1].id] == "cancelled"
    assert got[streams[1].id] == refs[1][:len(got[streams[1].id])]
    assert len(got[streams[1].id]) < len(refs[1])
    for i, s in enumerate(streams):
        if i != 1:
            assert got[s.id] == refs[i], i
            assert ends[s.id] in ("stop", "length")


def test_seeded_sampling_is_identical_batched_and_alone(tiny_model):
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, presence_penalty=0.3)
    ps = prompts(6, seed=33)
    depths = [0, 1, 2, 3, 2, 0]
    refs = [alone(tiny_model, p, depth=d, max_tokens=30, sampling=params, seed=100 + i)
            for i, (p, d) in enumerate(zip(ps, depths))]
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=6)
    streams = [dec.add(p, depth=d, max_tokens=30, sampling=params, seed=100 + i)
               for i, (p, d) in enumerate(zip(ps, depths))]
    got = batched(dec, streams)
    for s, ref in zip(streams, refs):
        assert got[s.id] == ref, s.depth


@pytest.mark.parametrize("force_redo", [False, True], ids=["compact", "dense redo"])
def test_rows_drawing_together_give_each_stream_its_own_tokens(tiny_model, monkeypatch,
                                                              force_redo):
    """Rows that share parameters and depth draft and accept in one call per step
    (``engine.decoding.plan.Group``), next to rows that cannot (penalties, another depth or
    temperature): every seeded stream still gets exactly its tokens alone. With
    ``force_redo`` every group row is judged inexact and redone densely with its key."""
    from engine.sampling import candidates

    shared = SamplingParams(temperature=0.9, top_k=20, top_p=0.95)
    params = [shared, shared, shared, shared, shared,
              dataclasses.replace(shared, presence_penalty=0.4),
              dataclasses.replace(shared, temperature=0.7), shared]
    depths = [2, 2, 2, 3, 3, 2, 2, 0]
    ps = prompts(8, seed=35)
    if force_redo:  # alone too: a dense redo draws with the same key, but over all of V
        rows, one = candidates.compiled_accept_rows, candidates.accept_compiled

        def inexact(params):
            f = rows(params)
            return lambda *a: (*f(*a)[:2], mx.zeros((a[0].shape[0],), dtype=mx.bool_))
        monkeypatch.setattr(candidates, "compiled_accept_rows", inexact)
        monkeypatch.setattr(candidates, "accept_compiled",
                            lambda *a: (*one(*a)[:2], mx.array(False)))
    refs = [alone(tiny_model, p, depth=d, max_tokens=24, sampling=sp, seed=300 + i)
            for i, (p, d, sp) in enumerate(zip(ps, depths, params))]
    calls = []
    real_rows = candidates.compiled_draft_rows
    monkeypatch.setattr(candidates, "compiled_draft_rows",
                        lambda *a: calls.append(a) or real_rows(*a))
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=8)
    streams = [dec.add(p, depth=d, max_tokens=24, sampling=sp, seed=300 + i)
               for i, (p, d, sp) in enumerate(zip(ps, depths, params))]
    got = batched(dec, streams)
    for s, ref in zip(streams, refs):
        assert got[s.id] == ref, s.depth
    assert calls  # groups really formed


def test_batched_depth2_sampling_follows_plain_distribution():
    """Pairs (t2, t3) sampled by 8-row batches at depth 2 (rows with their own seeds, next to
    greedy and depth-3 rows) fit the exact plain-decoding distribution."""
    pytest.importorskip("scipy")
    from tests.engine.decoding.test_distribution import (PROMPT, SETTINGS, V, chi_square_p,
                                                exact_pair_distribution)
    import tempfile

    d = build_tiny_model(Path(tempfile.mkdtemp()) / "m", vocab_size=V, seed=21, hidden=32)
    m = engine.load(d)
    model = same_weights(m, eos_token_ids=())
    params = SETTINGS[0]
    expected = exact_pair_distribution(model, params).ravel()
    counts = np.zeros(V * V)
    n_batches = 150
    for i in range(n_batches):
        carryover_of(model).reset_prompt_cache()
        dec = BatchDecoder(model, max_streams=10)
        rows = [dec.add(PROMPT, depth=2, max_tokens=4, sampling=params, seed=10_000 + 8 * i + j)
                for j in range(8)]
        dec.add(PROMPT[:3], depth=3, max_tokens=6)  # neighbours of other kinds
        dec.add(PROMPT[1:], depth=0, max_tokens=5, sampling=params, seed=i)
        got = batched(dec, rows)
        for r in rows:
            counts[got[r.id][1] * V + got[r.id][2]] += 1
    p = chi_square_p(counts, expected)
    assert p > 0.001, p


def test_every_row_matches_a_fresh_decode_after_each_commit(tiny_model):
    """Rollback per row: after every batched cycle, each row's next-step logits and its MTP
    head's next draft equal a fresh single-stream decode over the row's committed tokens."""
    ps = prompts(4, seed=34)
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=4)
    for p, d in zip(ps, [1, 3, 2, "auto"]):
        dec.add(p, depth=d, max_tokens=24)
    checked = 0

    def check(dec: BatchDecoder) -> None:
        nonlocal checked
        for b, st in enumerate(dec.active):
            live = dec.batch.extract(b)
            fresh = Session.fresh(tiny_model, use_mtp=True)
            fresh.prefill(list(live.fed))
            want = np.array(fresh.last_logits)
            # float32 rounding of [B, S] matmuls: OpenBLAS picks its kernels by shape, and
            # over prompt seeds 30-41 (a depth-4 row beside depths 1-3) single steps differed
            # by up to 1.5e-3 at logits of ~14 (1e-4 of the scale), the next step by 1e-5
            # again; a wrong cache would stay wrong
            np.testing.assert_allclose(np.array(live.last_logits), want,
                                       atol=2e-4 * np.abs(want).max())
            assert int(mx.argmax(live.last_logits).item()) == \
                int(mx.argmax(fresh.last_logits).item())
            assert live.mtp_rows + len(live.pending_tok) == len(live.fed) - 1  # MTP invariant
            assert live.mtp_cache[0].offset == live.mtp_rows
            assert draft_one(live, st.x0).tolist() == draft_one(fresh, st.x0).tolist()
            checked += 1

    batched(dec, list(dec.waiting), on_step=check)
    assert checked > 20


def test_memory_is_flat_across_many_joins_and_leaves(tiny_model):
    """1,000 streams join and leave (2 tokens each, 4 rows at a time): active memory after the
    last equals what it was early on, within a small slack."""
    m = same_weights(tiny_model, eos_token_ids=())
    ps = prompts(16, seed=35)
    dec = BatchDecoder(m, max_streams=4)
    mx.clear_cache()
    marks = []
    for i in range(1000):
        dec.add(ps[i % 16], depth=(0, 1, 2, "auto")[i % 4], max_tokens=2)
        if len(dec.waiting) >= 4:
            while dec.waiting or dec.admission.joining:
                dec.step()
        if i in (100, 999):
            while dec.busy:
                dec.step()
            carryover_of(m).reset_prompt_cache()
            mx.clear_cache()
            marks.append(mx.get_active_memory())
    assert marks[1] - marks[0] < 256 * 1024, marks


def test_bad_requests_fail_when_added(tiny_model):
    dec = BatchDecoder(tiny_model, max_streams=2)
    with pytest.raises(GenerationError):
        dec.add([], max_tokens=4)
    with pytest.raises(GenerationError):
        dec.add([1, 2, 10**9], max_tokens=4)
    with pytest.raises(GenerationError):
        dec.add([1, 2], max_tokens=0)
    with pytest.raises(GenerationError):
        dec.add([1, 2], max_tokens=4, drafter=ReplayDrafter([1]))  # MTP batch
    with pytest.raises(GenerationError):
        BatchDecoder(tiny_model, max_streams=0)
    assert not dec.busy


def test_replay_drafters_batch_without_the_head(tiny_model):
    """A batch of replay drafters (the bench's ceiling) needs no MTP head and is exact."""
    ps = prompts(4, seed=36)
    refs = [alone(tiny_model, p, depth=0, max_tokens=30) for p in ps]
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=4, use_mtp=False)
    streams = [dec.add(p, depth=d, max_tokens=30, drafter=ReplayDrafter(r))
               for p, d, r in zip(ps, [1, 2, 4, 6], refs)]
    got = batched(dec, streams)
    for s, ref in zip(streams, refs):
        assert got[s.id] == ref, s.depth
    assert dec.cycles <= 30 // 2 + 2


def test_concurrent_conversations_each_reuse_their_prompt_cache(tiny_model):
    """Four conversations decoded together, then each one's next turn (its prompt plus reply
    plus a new message) decoded together again: every stream resumes from its own cached
    state (reused prompt tokens), and the output is what a fresh decode gives."""
    ps = prompts(4, seed=37)
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=4)
    first = [dec.add(p, depth=d, max_tokens=12) for p, d in zip(ps, [1, 2, 0, 3])]
    got = batched(dec, first)
    follow = [p + got[s.id] + [5, 6, 7] for p, s in zip(ps, first)]
    refs = [alone(tiny_model, f, depth=2, max_tokens=10) for f in follow]
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=4)
    batched(dec, [dec.add(p, depth=d, max_tokens=12) for p, d in zip(ps, [1, 2, 0, 3])])
    second = [dec.add(f, depth=2, max_tokens=10) for f in follow]
    reused = run_reused(dec)
    for s, p, d in zip(second, ps, [1, 2, 0, 3]):
        # the state after the reply (a depth-0 stream's has no MTP cache in step: the one
        # after its prompt)
        assert reused[s.id] > len(p) if d else reused[s.id] == len(p), (reused, len(p))
    got2 = batched(dec, [])
    assert got2 == {}
    for s, ref in zip(second, refs):
        assert s.reply.generated == ref


STRUCT = {"type": "json_schema", "json_schema": {"schema": {
    "type": "object", "additionalProperties": False, "required": ["ok", "n"],
    "properties": {"ok": {"type": "boolean"},
                   "n": {"type": "integer", "minimum": 0, "maximum": 999}}}}}


@pytest.mark.parametrize("params", [SamplingParams(),
                                    SamplingParams(temperature=0.9, top_p=0.95, top_k=20)],
                         ids=["greedy", "sampled"])
def test_structured_streams_speculate_in_a_batch_as_alone(demo_model, params):
    """Streams under a JSON schema speculate in the batch (depth 2, auto or 3) next to free
    streams: each one's tokens equal its own decode alone (seeded when sampled), its output
    validates, and its cycles really drafted under the mask."""
    from engine.sampling.grammar import Constraint

    def constraint():
        return Constraint.for_format(demo_model.tokenizer, STRUCT,
                                     vocab_size=demo_model.info.vocab_size,
                                     eos_ids=demo_model.info.eos_token_ids)

    ps = _demo_prompts(demo_model, 4)
    # auto's depth choices depend on its neighbours (one controller per batch), and a seeded
    # stream uses one key per draft: sampled streams are compared at fixed depths
    depths = [2, 3, "auto" if params.greedy else 3, 1]
    structured = [True, False, True, False]
    refs = [alone(demo_model, p, depth=d, max_tokens=64, sampling=params, seed=50 + i,
                  constraint=constraint() if s else None)
            for i, (p, d, s) in enumerate(zip(ps, depths, structured))]
    carryover_of(demo_model).reset_prompt_cache()
    dec = BatchDecoder(demo_model, max_streams=4)
    streams = [dec.add(p, depth=d, max_tokens=64, sampling=params, seed=50 + i,
                       constraint=constraint() if s else None)
               for i, (p, d, s) in enumerate(zip(ps, depths, structured))]
    drafted = {s.id: 0 for s in streams}
    got, reasons = {s.id: [] for s in streams}, {}
    while dec.busy:
        for st, ev in dec.step():
            got[st.id] += ev.token_ids
            drafted[st.id] += len(ev.stats.drafted) if ev.stats else 0
            reasons[st.id] = ev.finish_reason or reasons.get(st.id)
    for s, ref, structured_ in zip(streams, refs, structured):
        assert got[s.id] == ref, s.depth
        if structured_:
            assert reasons[s.id] == "stop"
            eos = set(demo_model.info.eos_token_ids)
            doc = json.loads(demo_model.tokenizer.decode([t for t in got[s.id] if t not in eos]))
            assert set(doc) == {"ok", "n"}
            assert drafted[s.id] > 0  # it speculated


@pytest.mark.parametrize("mode", ["greedy", "sampled", "tied"])
def test_plain_batches_are_pipelined_and_exact(tiny_model, monkeypatch, mode):
    """A batch whose rows all decode plainly queues each step before reading the one before
    (``engine.decoding.plain``). Streams finishing early, joining from a queue, joining
    late and cancelled mid-batch each still get exactly their tokens alone; with ``tied``
    about every third compact draw is judged tied and redrawn densely (the queued step is rewound and
    re-queued with the same keys). Without a head (``use_mtp=False``) the state each stream
    leaves behind is its reply's, so its next turn resumes from it: it must equal a fresh
    decode, which it does not if the state kept included the step queued after it."""
    from engine.decoding import draw

    params = SamplingParams() if mode == "greedy" else \
        SamplingParams(temperature=0.9, top_k=20, top_p=0.95)
    if mode == "tied":
        real = draw.pick

        def tied(logits, params, counts, key, *, dense=False):  # about every third draw
            y, exact = real(logits, params, counts, key, dense=dense)  # (by its key: the same
            if exact is None or int(mx.sum(key).item()) % 3:          # draws alone)
                return y, exact
            return y, mx.zeros_like(exact)
        monkeypatch.setattr(draw, "pick", tied)
    ps = prompts(6, seed=38)
    budgets = [30, 7, 30, 18, 30, 25]
    refs = [alone(tiny_model, p, depth=0, max_tokens=n, sampling=params, seed=400 + i)
            for i, (p, n) in enumerate(zip(ps, budgets))]
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=3, use_mtp=False)
    cancel = threading.Event()
    streams = [dec.add(p, depth=0, max_tokens=n, sampling=params, seed=400 + i,
                       cancel=cancel if i == 3 else None)
               for i, (p, n) in enumerate(zip(ps[:5], budgets))]
    got, ends, ahead, step = {s.id: [] for s in streams}, {}, 0, 0
    while dec.busy:
        if step == 4:  # joins late, between cycles
            streams.append(dec.add(ps[5], depth=0, max_tokens=25, sampling=params, seed=405))
            got[streams[-1].id] = []
        if step == 9:
            cancel.set()
        for st, ev in dec.step():
            got[st.id].extend(ev.token_ids)
            ends[st.id] = ev.finish_reason or ends.get(st.id)
        ahead += dec.plain.ahead is not None
        step += 1
    assert ahead > 5  # steps really were queued ahead
    assert ends[streams[3].id] == "cancelled"
    assert got[streams[3].id] == refs[3][:len(got[streams[3].id])] != refs[3]
    for i, s in enumerate(streams):
        if i != 3:
            assert got[s.id] == refs[i], (mode, i)
    # the prompt cache keeps one conversation per row (3): the last three to finish, each
    # with the state after its reply (its last token emitted, not fed)
    ends_kept = {s.fed for s in carryover_of(tiny_model).prompt_cache.snapshots}
    kept = [i for i in range(6) if tuple(ps[i] + got[streams[i].id][:-1]) in ends_kept]
    assert len(kept) == 3 and 3 not in kept, kept
    follow = [ps[i] + got[streams[i].id] + [5, 6] for i in kept]
    other = same_weights(tiny_model)  # its own prompt cache
    refs2 = [alone(other, f, depth=0, max_tokens=6) for f in follow]
    nxt = [dec.add(f, depth=0, max_tokens=6) for f in follow]
    reused = run_reused(dec)
    for s, i, ref in zip(nxt, kept, refs2):
        assert reused[s.id] == len(ps[i]) + len(got[streams[i].id]) - 1, (mode, i)
        assert s.reply.generated == ref, (mode, i)


def test_batch_controllers_time_each_cycle_once_and_start_from_a_neighbour(tiny_model):
    """The auto rows of a batch share one controller per batch size: each auto row's
    acceptance is observed, the cycle's time once (at the depth the cycle was padded to). A
    batch size seen for the first time starts from the nearest size's learnt state, without
    a warm-up."""
    from engine.depth.controller import AdaptiveDepth

    m = same_weights(tiny_model, eos_token_ids=())
    dec = BatchDecoder(m, max_streams=3)
    for p, n in zip(prompts(3, seed=39), [20, 20, 5]):
        dec.add(p, depth="auto", max_tokens=n)
    rows: dict[int, int] = {}  # batch size -> auto row-cycles observed
    while dec.busy:
        for st, ev in dec.step():
            if ev.stats is not None:
                rows[ev.stats.batch_rows] = rows.get(ev.stats.batch_rows, 0) + 1
    for n in (2, 3):
        assert carryover_of(m).controllers[n]._cycles == rows[n] // n, (n, rows)
    seeded = AdaptiveDepth(carryover_of(m).controllers[3].max_depth,
                           initial={"cost": {0: 0.01, 1: 0.012, 2: 0.015},
                                    "acceptance": [0.9, 0.7, 0.5], "depth": 2})
    carryover_of(m).controllers = {6: seeded}
    fresh = carryover_of(m).controller(m, 5)
    assert fresh is carryover_of(m).controllers[5] and fresh.warmup == 0
    assert fresh.state()["acceptance"] == seeded.state()["acceptance"]
    assert fresh.costs() == pytest.approx(seeded.costs())
    assert fresh.choose()[0] == seeded.choose()[0]


def test_a_plain_batch_switches_to_speculation_and_back(tiny_model, monkeypatch):
    """Plain rows pipelined alone, then a speculating stream joins (the batch runs full
    cycles, the queued plain step rewound first), then it finishes (pipelined again): every
    stream still equals its decode alone, and both kinds of cycle really ran."""
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
    ps = prompts(3, seed=40)
    plan = [(0, 30), (0, 26), (2, 8)]  # (depth, budget); the last joins at step 3
    refs = [alone(tiny_model, p, depth=d, max_tokens=n, sampling=params, seed=500 + i)
            for i, (p, (d, n)) in enumerate(zip(ps, plan))]
    ran = {"plain": 0, "full": 0}
    from engine.decoding import plain as plain_mod, speculative

    plain, full = plain_mod.PlainPipeline.cycle, speculative.launch
    monkeypatch.setattr(plain_mod.PlainPipeline, "cycle",
                        lambda self, *a, **k: ran.__setitem__("plain", ran["plain"] + 1)
                        or plain(self, *a, **k))
    monkeypatch.setattr(speculative, "launch",
                        lambda *a, **k: ran.__setitem__("full", ran["full"] + 1) or full(*a, **k))
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=3)
    streams = [dec.add(p, depth=d, max_tokens=n, sampling=params, seed=500 + i)
               for i, (p, (d, n)) in enumerate(zip(ps[:2], plan))]
    got, step = {}, 0
    while dec.busy or len(streams) < 3:
        if step == 3:
            streams.append(dec.add(ps[2], depth=2, max_tokens=8, sampling=params, seed=502))
        for st, ev in dec.step():
            got.setdefault(st.id, []).extend(ev.token_ids)
        step += 1
    for s, ref in zip(streams, refs):
        assert got[s.id] == ref, s.depth
    assert ran["plain"] > 10 and ran["full"] >= 2, ran


def _name(part) -> str:
    return getattr(part, "func", part).__name__


@pytest.mark.parametrize("together", [True, False], ids=["one forward", "one each"])
def test_short_prompts_that_arrive_together_join_in_one_step(tiny_model, monkeypatch,
                                                             together):
    """Prompts waiting together are prefilled in one step while they fit ``PREFILL_BUDGET``
    prompt tokens (in one forward, ``engine.decoding.together``; else one admission each,
    each first token handed out as it comes), so they join the batch together; past the
    budget the next waits for the next step. Replies are unchanged."""
    from engine.decoding import decoder as decoder_mod
    from engine.decoding import together as together_mod

    if not together:
        monkeypatch.setattr(together_mod, "MIN_ROWS", 99)
    ps = prompts(4, seed=41)
    refs = [alone(tiny_model, p, depth=2, max_tokens=9) for p in ps]
    carryover_of(tiny_model).reset_prompt_cache()
    dec = BatchDecoder(tiny_model, max_streams=4)
    streams = [dec.add(p, depth=2, max_tokens=9) for p in ps]
    got = {s.id: [] for s in streams}
    names, first = [], []
    for part in dec.parts():  # the generator decides the next part after each call
        names.append(_name(part))
        for st, ev in part():
            got[st.id].extend(ev.token_ids)
            if _name(part) == "admit_step":
                first.append(st.id)
    assert names == ["admit_step"] * (1 if together else 4) + ["cycle_step"]
    assert len(first) == 4 and len(dec.active) == 4
    for st, ev in dec.run():
        got[st.id].extend(ev.token_ids)
    assert [got[s.id] for s in streams] == refs

    carryover_of(tiny_model).reset_prompt_cache()
    monkeypatch.setattr(decoder_mod, "PREFILL_BUDGET", len(ps[0]) + len(ps[1]) - 1)
    dec = BatchDecoder(tiny_model, max_streams=4)
    for p in ps[:2]:
        dec.add(p, depth=2, max_tokens=9)
    joined = []
    for part in dec.parts():
        part()
        joined.append(len(dec.active))
    assert joined == [1, 1]  # one admission, then the cycle: the second did not fit
