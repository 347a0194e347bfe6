"""The scheduler's batched worker (``max_streams`` > 1) on a real tiny model: requests decode
together, each sink sees exactly its single-stream reply, a bad request or a cancel touches
no other, and the hosted form runs the whole batch in one ``run_next``."""
from __future__ import annotations

import threading
import time

import pytest

from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.core.scheduler import Done, Failed, GenRequest, Scheduler, Started
from engine.types import Event
from tests.engine.decoding.test_decode import prompts

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def tiny_model(tmp_path):
    import engine
    from tests.tinymodels import build_tiny_model

    return engine.load(build_tiny_model(tmp_path / "m", seed=3))


class Sink:
    def __init__(self) -> None:
        self.items: list = []
        self.done = threading.Event()

    def __call__(self, item) -> None:
        self.items.append(item)
        if isinstance(item, (Done, Failed)):
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [t for i in self.items if isinstance(i, Event) for t in i.token_ids]

    @property
    def batch_max(self) -> int:
        return max((i.stats.batch_rows for i in self.items
                    if isinstance(i, Event) and i.stats is not None), default=1)


def _alone(model, p, **kw) -> list[int]:
    carryover_of(model).reset_prompt_cache()
    return [t for ev in model.generate(p, **kw) for t in ev.token_ids]


def _requests():
    params = SamplingParams(temperature=0.8, top_k=12)
    ps = prompts(6, seed=41)
    kws = [dict(depth=d, max_tokens=28, sampling=params if i % 2 else SamplingParams(),
                seed=50 + i) for i, d in enumerate([0, 1, 2, 3, 1, 2])]
    return ps, kws


def test_threaded_batch_gives_every_request_its_own_reply(tiny_model):
    ps, kws = _requests()
    refs = [_alone(tiny_model, p, **kw) for p, kw in zip(ps, kws)]
    carryover_of(tiny_model).reset_prompt_cache()
    s = Scheduler(model=tiny_model, max_streams=4).start()
    try:
        sinks = [Sink() for _ in ps]
        for i, (p, kw) in enumerate(zip(ps, kws)):
            s.submit(GenRequest(id=str(i), prompt_ids=tuple(p), **kw), sinks[i])
        bad = Sink()
        s.submit(GenRequest(id="bad", prompt_ids=(1, 10**9), max_tokens=4), bad)
        for k in sinks + [bad]:
            assert k.done.wait(60)
    finally:
        s.stop()
    for k, ref in zip(sinks, refs):
        assert isinstance(k.items[0], Started) and isinstance(k.items[-1], Done)
        assert k.tokens == ref
        assert k.items[-1].summary.tokens == len(ref)
    assert isinstance(bad.items[-1], Failed) and "out of range" in str(bad.items[-1].error)
    assert max(k.batch_max for k in sinks) >= 2  # requests shared cycles
    assert s.busy == 0 and s.completed == 7


def test_cancelling_one_batched_request_leaves_the_others(tiny_model):
    ps, kws = _requests()
    refs = [_alone(tiny_model, p, **kw) for p, kw in zip(ps, kws)]
    carryover_of(tiny_model).reset_prompt_cache()
    s = Scheduler(model=tiny_model, max_streams=8).start()
    try:
        sinks = [Sink() for _ in ps]
        reqs = [GenRequest(id=str(i), prompt_ids=tuple(p), **kw)
                for i, (p, kw) in enumerate(zip(ps, kws))]
        reqs[2] = GenRequest(id="2", prompt_ids=tuple(ps[2]), **dict(kws[2], max_tokens=4000))
        for r, k in zip(reqs, sinks):
            s.submit(r, k)
        deadline = time.time() + 30
        while len(sinks[2].tokens) < 3 and time.time() < deadline:
            time.sleep(0.01)
        reqs[2].cancel.set()
        for k in sinks:
            assert k.done.wait(60)
    finally:
        s.stop()
    ends = [next(i for i in reversed(k.items) if isinstance(i, Event)) for k in sinks]
    assert ends[2].finish_reason == "cancelled"
    for i, (k, ref) in enumerate(zip(sinks, refs)):
        if i != 2:
            assert k.tokens == ref, i


def test_hosted_batch_runs_everything_in_one_run_next(tiny_model):
    ps, kws = _requests()
    refs = [_alone(tiny_model, p, **kw) for p, kw in zip(ps, kws)]
    carryover_of(tiny_model).reset_prompt_cache()
    wakes = []
    s = Scheduler.hosted(lambda: wakes.append(1), max_streams=3)
    s.set_model(tiny_model)
    sinks = [Sink() for _ in ps]
    for i, (p, kw) in enumerate(zip(ps, kws)):
        s.submit(GenRequest(id=str(i), prompt_ids=tuple(p), client="chat" if i else "server",
                            **kw), sinks[i])
    assert s.run_next() is True
    assert all(k.done.is_set() for k in sinks)
    assert [k.tokens for k in sinks] == refs
    assert s.run_next() is False and s.busy == 0


def test_a_burst_arriving_a_few_ms_apart_prefills_together(tiny_model, monkeypatch):
    """Requests that reach an idle worker's queue a millisecond or two apart (a burst of
    clients) start in one batch step and prefill in one forward; a lone request starts after
    waiting ``GATHER_S`` at most once."""
    from engine.core import scheduler as sched_mod
    from engine.decoding import together

    groups = []
    real = together.prefill

    def spy(model, sessions, prompts_, back):
        groups.append(len(sessions))
        return real(model, sessions, prompts_, back)
    monkeypatch.setattr(together, "prefill", spy)
    # wider than the shipped 2 ms, so a loaded machine's scheduling cannot split the burst
    monkeypatch.setattr(sched_mod, "GATHER_S", 0.05)
    monkeypatch.setattr(sched_mod, "GATHER_MAX_S", 0.5)
    ps = [p for p in prompts(12, seed=9) if len(p) >= 8][:4]
    refs = [_alone(tiny_model, p, depth=2, max_tokens=10) for p in ps]
    carryover_of(tiny_model).reset_prompt_cache()
    s = Scheduler(model=tiny_model, max_streams=4).start()
    try:
        sinks = [Sink() for _ in ps]
        for i, p in enumerate(ps):
            s.submit(GenRequest(id=str(i), prompt_ids=tuple(p), depth=2, max_tokens=10),
                     sinks[i])
            time.sleep(0.01)
        for k in sinks:
            assert k.done.wait(60)
        assert groups == [4]
        assert [k.tokens for k in sinks] == refs
        lone = Sink()
        t0 = time.perf_counter()
        s.submit(GenRequest(id="lone", prompt_ids=tuple(ps[0][:-1]), max_tokens=2), lone)
        assert lone.done.wait(60)
        started = next(i for i in lone.items if isinstance(i, Started))
        assert started.waited_s < 0.3  # one GATHER_S, not GATHER_MAX_S
        assert time.perf_counter() - t0 < 5
    finally:
        s.stop()
