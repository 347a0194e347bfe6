"""The memory budget (engine/core/memory.py): sizes parse, a request's need is estimated from the
model's config, the gate refuses what cannot fit alone, cuts a reply that would outgrow the
budget, holds what fits alone but not beside the others, and the scheduler ends a cut reply
with ``finish_reason="length"`` and a note."""
from __future__ import annotations

import threading

import pytest

from engine.core import memory
from engine.core.memory import Footprint, MemoryGate, MemoryRefused, parse_budget
from engine.core.scheduler import Done, GenRequest, Scheduler
from engine.types import Event, SamplingParams

pytestmark = pytest.mark.timeout(120)

BASE = 300 * 2**20


@pytest.fixture
def steady(monkeypatch):
    """A process whose resident memory stays at BASE (the gate's arithmetic, exactly)."""
    monkeypatch.setattr(memory, "resident_bytes", lambda: BASE)


def _beside(room: int) -> int:
    """A "+SIZE" budget that leaves ``room`` for requests after MLX's cache share."""
    return -int(room / (1 - memory.CACHE_SHARE)) - 2


def test_parse_budget():
    assert parse_budget("8GB") == 8 * 2**30
    assert parse_budget("512 MiB") == 512 * 2**20
    assert parse_budget("1.5g") == int(1.5 * 2**30)
    assert parse_budget("2") == 2 * 2**30  # a small plain number is GB
    assert parse_budget("100000000") == 100_000_000
    assert parse_budget("+300MB") == -300 * 2**20  # beside the loaded model
    for bad in ("lots", "-1GB", "0"):
        with pytest.raises(ValueError, match="--memory-budget"):
            parse_budget(bad)


def test_footprint_grows_with_prompt_reply_and_depth(tiny_model):
    fp = Footprint.of(tiny_model)
    assert fp is not None and fp.per_token > 0 and fp.gdn_state > 0
    assert fp.need(100, 10, 3) < fp.need(1000, 10, 3) < fp.need(1000, 1000, 3)
    assert fp.need(100, 10, 0) <= fp.need(100, 10, 3)
    assert Footprint.of(object()) is None


def test_gate_refuses_cuts_holds_and_releases(tiny_model, steady):
    fp = Footprint.of(tiny_model)
    gate = MemoryGate(_beside(fp.need(50, 20, 2) + fp.per_token // 2))  # 50 + 20 tokens
    gate.attach(tiny_model)
    assert gate.base == BASE and gate.cache_limit > 0
    assert fp.need(50, 20, 2) < gate.budget - gate.base - gate.cache_limit < fp.need(50, 21, 2)
    with pytest.raises(MemoryRefused, match="memory budget"):
        gate.verdict("big", 10_000_000, 1, 2)
    kind, n = gate.verdict("a", 50, 1000, 2)
    assert kind == "run" and n == 20  # cut to what fits alone
    assert gate.verdict("b", 50, 10, 2) == ("wait", None)  # fits alone, not beside "a"
    gate.remeasure()  # nothing else grew: the base stays
    assert gate.base == BASE
    gate.release("a", tokens=70)
    assert gate.kept == 70 * fp.per_token
    gate.drop_kept()
    assert gate.verdict("b", 50, 10, 2) == ("run", 10)
    # growth: the newest rows past the budget are the ones cut
    rows = [("b", 50, 10, 2), ("c", 50, 30, 2)]
    assert gate.over(rows) == ["c"]
    assert gate.status()["budget_bytes"] == gate.budget


def test_scheduler_cuts_a_reply_that_would_outgrow_the_budget(tiny_model, steady):
    fp = Footprint.of(tiny_model)
    prompt = tuple(tiny_model.tokenizer.encode("hello there, how are you"))
    depth = 2  # the request's
    sched = Scheduler(model=tiny_model, max_streams=2,
                      memory_budget=_beside(fp.need(len(prompt), 6, depth) + 10)).start()
    try:
        sched.wait_ready(30)
        items: list = []
        done = threading.Event()

        def sink(item):
            items.append(item)
            if isinstance(item, Done):
                done.set()
        sched.submit(GenRequest(id="r", prompt_ids=prompt, max_tokens=500, depth=2,
                                sampling=SamplingParams(temperature=0.0)), sink)
        assert done.wait(60)
        events = [i for i in items if isinstance(i, Event)]
        end = items[-1]
        n = sum(len(e.token_ids) for e in events)
        assert events[-1].finish_reason in ("length", "stop")
        if events[-1].finish_reason == "length":  # (an EOS before the cut is fine too)
            assert n <= 6 and "memory budget" in end.note
        assert sched.status()["memory"]["budget_bytes"] == sched.memory.budget
    finally:
        sched.stop()
