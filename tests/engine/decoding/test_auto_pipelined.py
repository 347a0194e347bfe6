"""``auto`` rows ride the plain pipeline while their controller chooses depth 0
(``engine.decoding.plain``, ``BatchDecoder._cycle``).

A scripted controller stands in for ``AdaptiveDepth`` so the depths are known: the test
checks that every choice is used for exactly one cycle and in order (the choice made ahead,
when the pipeline queues the next step, is the one the next cycle runs), that depth-0 runs
really were pipelined, that no queued step was rewound for a cycle that drafts (the pipeline
asks first), that each cycle is timed once at its depth, and that greedy replies still equal
plain decoding's: alone, batched with fixed-depth rows, with rows leaving and joining.
"""
from __future__ import annotations

import itertools

import pytest

from engine.core.carryover import carryover_of
from engine.decoding import plain as plain_mod
from engine.decoding.decoder import BatchDecoder
from tests.engine.decoding.test_batching import alone, same_weights
from tests.engine.decoding.test_decode import prompts
from tests.engine.decoding.test_distribution import small_vocab_model  # noqa: F401 (fixture)


class Scripted:
    """``AdaptiveDepth``'s interface with depths from a script (repeated), logging what the
    decoder asks and tells it."""

    def __init__(self, script: list[int], warmup: int = 0) -> None:
        self.script = itertools.cycle(script)
        self.warmup = warmup
        self.chosen: list[int] = []
        self.timed: list[int] = []
        self.seconds: list[float] = []
        self.max_depth = 3

    @property
    def warming_up(self) -> bool:
        return len(self.timed) < self.warmup

    def choose(self) -> tuple[int, str]:
        self.chosen.append(next(self.script))
        return self.chosen[-1], "scripted"

    def observe(self, stats, *, timed=True, position=None) -> None:
        pass

    def observe_time(self, depth: int, seconds: float) -> None:
        assert seconds >= 0
        self.timed.append(depth)
        self.seconds.append(seconds)

    def new_request(self, continues: bool = False) -> None:
        pass


def _scripted(monkeypatch, model, ctrl: Scripted) -> None:
    monkeypatch.setattr(type(carryover_of(model)), "controller",
                        lambda self, m, rows, drafter=False: ctrl)


def _count_rewinds(monkeypatch) -> dict:
    """Rewinds of a queued plain step (``settle`` with a step queued), and how many cycles
    found one queued."""
    n = {"rewound": 0, "ran_queued": 0}
    settle, cycle = plain_mod.PlainPipeline.settle, plain_mod.PlainPipeline.cycle

    def counted_settle(self, streams):
        n["rewound"] += self.ahead is not None
        return settle(self, streams)

    def counted_cycle(self, streams, **kw):
        n["ran_queued"] += self.ahead is not None
        return cycle(self, streams, **kw)
    monkeypatch.setattr(plain_mod.PlainPipeline, "settle", counted_settle)
    monkeypatch.setattr(plain_mod.PlainPipeline, "cycle", counted_cycle)
    return n


@pytest.mark.parametrize("warmup", [0, 4])
def test_auto_at_depth_zero_is_pipelined_and_each_choice_runs_once(tiny_model, monkeypatch,
                                                                   warmup):
    m = same_weights(tiny_model, eos_token_ids=())
    p = prompts(1, seed=61)[0]
    ref = alone(m, p, depth=0, max_tokens=40)
    ctrl = Scripted([0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 3], warmup=warmup)
    _scripted(monkeypatch, m, ctrl)
    n = _count_rewinds(monkeypatch)
    carryover_of(m).reset_prompt_cache()
    dec = BatchDecoder(m, max_streams=1)
    st = dec.add(p, depth="auto", max_tokens=40)
    got, ran = [], []  # ran: (depth run, tokens left in the budget before the cycle)
    for s, ev in dec.run():
        if ev.stats is not None:
            ran.append((ev.stats.depth, 40 - len(got)))
        got.extend(ev.token_ids)
    assert got == ref == st.reply.generated
    # every cycle ran the depth chosen for it (never past the budget's last token), in
    # order; a choice made ahead for a cycle that never came (the reply ended) is the only
    # extra one
    assert len(ctrl.chosen) - len(ran) in (0, 1)
    assert [d for d, _ in ran] == [min(c, left - 1) for c, (_, left) in zip(ctrl.chosen, ran)]
    assert sum(d > 0 for d, _ in ran) >= 3
    ran = [d for d, _ in ran]
    assert ctrl.timed == ran  # each cycle timed once, at its depth
    assert all(s > 0 for s in ctrl.seconds)
    assert n["ran_queued"] > 10  # depth-0 stretches were pipelined
    assert n["rewound"] == 0  # a drafting cycle never threw a queued step away


def test_auto_rows_batched_with_fixed_rows_equal_plain_decoding(tiny_model, monkeypatch):
    """Two auto rows and a fixed depth-0 row pipelined together, a fixed depth-2 row joining
    mid-way (full cycles), then leaving (pipelined again), rows finishing at different
    times: every greedy reply equals plain decoding's."""
    m = same_weights(tiny_model)
    ps = prompts(4, seed=62)
    plan = [("auto", 30), (0, 24), ("auto", 17), (2, 8)]
    refs = [alone(m, p, depth=0, max_tokens=b) for p, (_, b) in zip(ps, plan)]
    ctrl = Scripted([0, 0, 0, 1, 0, 0, 0, 0, 2, 0, 0])
    _scripted(monkeypatch, m, ctrl)
    n = _count_rewinds(monkeypatch)
    carryover_of(m).reset_prompt_cache()
    dec = BatchDecoder(m, max_streams=4)
    streams = [dec.add(p, depth=d, max_tokens=b) for p, (d, b) in zip(ps[:3], plan)]
    got, step = {s.id: [] for s in streams}, 0
    while dec.busy or len(streams) < 4:
        if step == 6:
            streams.append(dec.add(ps[3], depth=2, max_tokens=8))
            got[streams[-1].id] = []
        for st, ev in dec.step():
            got[st.id].extend(ev.token_ids)
        step += 1
    for s, ref in zip(streams, refs):
        assert got[s.id] == ref, s.depth
    assert n["ran_queued"] > 5
    assert len(ctrl.timed) == dec.cycles


class OpeningPlain(Scripted):
    """Depth 0 for a reply's first cycle (pipelined), then ``then``: each reply mixes a plain
    cycle and a drafting one."""

    def __init__(self, then: int) -> None:
        super().__init__([then])
        self.n = 0

    def choose(self) -> tuple[int, str]:
        self.n += 1
        self.chosen.append(0 if self.n == 1 else 1)
        return self.chosen[-1], "scripted"

    def new_request(self, continues: bool = False) -> None:
        self.n = 0


def test_sampled_auto_mixing_plain_and_drafting_cycles_follows_plain_distribution(
        small_vocab_model, monkeypatch):
    """Seeded sampled ``auto`` replies whose first cycle is a pipelined plain one and whose
    second drafts: the joint distribution of the tokens the two cycles emit fits plain
    sampling's, enumerated exactly (chi-square)."""
    pytest.importorskip("scipy")
    import numpy as np

    from engine import SamplingParams
    from tests.engine.decoding.test_distribution import (PROMPT, V, chi_square_p,
                                                         exact_pair_distribution)

    model, params = small_vocab_model, SamplingParams(temperature=1.0)
    expected = exact_pair_distribution(model, params).ravel()
    ctrl = OpeningPlain(then=1)
    _scripted(monkeypatch, model, ctrl)
    n = _count_rewinds(monkeypatch)
    counts, ran = np.zeros(V * V), set()
    for i in range(1200):
        carryover_of(model).reset_prompt_cache()
        toks, depths = [], []
        for ev in model.generate(PROMPT, max_tokens=4, depth="auto", sampling=params,
                                 seed=104729 + i):
            toks.extend(ev.token_ids)
            if ev.stats is not None:
                depths.append(ev.stats.depth)
        ran.add(tuple(depths))
        counts[toks[1] * V + toks[2]] += 1
    # t2 from the plain cycle, t3 from a drafting one (its draft accepted or not), every reply
    assert {d[:2] for d in ran} == {(0, 1)}, ran
    assert n["rewound"] == 0
    assert chi_square_p(counts, expected) > 0.001
