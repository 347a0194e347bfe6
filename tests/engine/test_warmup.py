"""The background warm-up (engine/core/warmup.py): it compiles the (rows, depth) shapes ahead
through the real decoder, leaves the shared prompt cache and depth controllers alone, yields
to a request after one step, reports progress, can be cancelled, and can be turned off."""
from __future__ import annotations

import threading
import time

import pytest

from engine.core import warmup
from engine.core.carryover import carryover_of
from engine.core.scheduler import Done, GenRequest, Scheduler, Started
from engine.types import SamplingParams

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def warmup_on(monkeypatch):
    monkeypatch.setenv(warmup.ENV, "1")  # tests/conftest.py turns it off for the others
    yield
    from engine.paths import data_dir

    (data_dir() / "warmup.json").unlink(missing_ok=True)  # what a warm-up kept stays here


def _compiled_shapes(model) -> set[tuple[int, int]]:
    """(rows, tokens) of every compiled GDN layer function on the trunk's first linear layer."""
    layer = next(la for la in model.text_model.model.layers if la.is_linear)
    fns = layer.__dict__.get("_mtpchat_layer", {})
    return {(key[0][0], key[0][1]) for key in fns}


def test_warmup_compiles_every_row_count_ahead(tiny_model):
    before = _compiled_shapes(tiny_model)
    carry = carryover_of(tiny_model)
    cached = list(carry.prompt_cache.snapshots)
    controllers = dict(carry.controllers)
    seen: list[tuple[int, int]] = []
    w = warmup.WarmUp(tiny_model, max_streams=3, depths=(2, 1), samplings=(warmup.GREEDY,),
                      on_progress=lambda d, t: seen.append((d, t)))
    assert w.total == 6
    steps = 0
    while w.step():
        steps += 1
        assert steps < 200
    assert w.finished and w.done == w.total == 6
    assert seen[-1] == (6, 6) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    shapes = _compiled_shapes(tiny_model) - before
    # verify forwards over depth + 1 tokens at every row count 1..3 were compiled by the warm-up
    for rows in (1, 2, 3):
        for tokens in (2, 3):
            assert (rows, tokens) in shapes | before, (rows, tokens, shapes)
    assert dict(carry.controllers) == controllers
    try:  # the timed cycles seed the controllers made from now on, per batch size
        assert set(carry.cost_hints) == {1, 2, 3}
        assert all(set(h) == {1, 2} and min(h.values()) > 0 for h in carry.cost_hints.values())
        fresh = carry.controller(tiny_model, 2)
        assert fresh.warmup == 0 and fresh.state()["cost"]
        del carry.controllers[2]
        # ... and the acceptance its rows saw, by draft position, replaces the generic prior
        reached = [r for r, _ in w.tally]
        assert reached[0] > 0 and all(0 <= a <= r for r, a in w.tally)
        assert reached == sorted(reached, reverse=True)  # a position is reached after the one before
        hint = carry.acceptance_hint
        assert hint and hint == w.acceptance() and all(0.0 <= a <= 1.0 for a in hint)
        saved = dict(carry.controllers)  # a size with no other controller to start from
        carry.controllers.clear()
        try:
            fresh = carry.controller(tiny_model, 2)
            assert fresh._acc.priors[:len(hint)] == hint
        finally:
            carry.controllers.clear()
            carry.controllers.update(saved)
    finally:
        carry.cost_hints.clear()
        carry.acceptance_hint.clear()
    assert list(carry.prompt_cache.snapshots) == cached
    assert not w.step()  # finished: nothing more


def test_warmup_cancel_and_switch(tiny_model, monkeypatch):
    w = warmup.WarmUp(tiny_model, max_streams=2, depths=(1,), samplings=(warmup.GREEDY,))
    assert w.step()
    w.cancel()
    assert not w.step() and w.finished and w.done < w.total
    monkeypatch.setenv(warmup.ENV, "0")
    assert warmup.for_model(tiny_model, max_streams=2) is None
    monkeypatch.setenv(warmup.ENV, "1")
    assert warmup.for_model(tiny_model, max_streams=2) is not None
    assert warmup.for_model(object(), max_streams=2) is None  # a scripted fake: nothing to warm


def _reply(sched, model) -> list:
    """Submit a short greedy request to ``sched`` and wait for it; its items."""
    items: list = []
    done = threading.Event()

    def sink(item) -> None:
        items.append(item)
        if isinstance(item, Done):
            done.set()
    sched.submit(GenRequest(id="r", prompt_ids=tuple(model.tokenizer.encode("hello")),
                            max_tokens=8, depth=2, sampling=SamplingParams(temperature=0.0)),
                 sink)
    assert done.wait(60)
    return items


def test_request_preempts_the_warmup_and_it_resumes(tiny_model):
    progress: list[tuple[int, int]] = []
    sched = Scheduler(model=tiny_model, max_streams=4)
    started = threading.Event()
    sched.add_warmup_listener(lambda d, t: (progress.append((d, t)), started.set()))
    sched.start()
    try:
        sched.wait_ready(30)
        assert started.wait(60), "the warm-up never reported progress"
        w = sched.warmup
        assert w is not None and sched.status()["warmup"]["total"] == w.total
        submitted_during = not w.finished
        items = _reply(sched, tiny_model)
        waited = next(i.waited_s for i in items if isinstance(i, Started))
        if submitted_during:  # at most one warm-up step stood before it
            assert waited < 5.0
        deadline = time.time() + 90
        # the last report comes after ``finished`` is set (the worker hints the costs first)
        while not (w.finished and progress[-1] == (w.total, w.total)) and \
                time.time() < deadline:
            time.sleep(0.05)
        assert w.finished and w.done == w.total
        assert progress[-1] == (w.total, w.total)
        assert sched.status()["warmup"]["finished"] is True
    finally:
        sched.stop()
        carryover_of(tiny_model).cost_hints.clear()
        carryover_of(tiny_model).acceptance_hint.clear()


def test_the_next_process_starts_from_the_figures_a_warm_up_kept(tiny_model):
    """What a warm-up measured is kept per model, dtype and machine, merged into what an
    earlier one kept; a new carryover (the next process) starts from it; a corrupt file
    only means no hint."""
    from engine.core.carryover import Carryover
    from engine.hub import store
    from engine.paths import data_dir

    info = tiny_model.info
    path = data_dir() / "warmup.json"
    path.unlink(missing_ok=True)
    store.write_warm_hint(info.path, info.dtype, {"cost": {"7": {"1": 0.5}},
                                                   "acceptance": [0.1]})
    w = warmup.WarmUp(tiny_model, max_streams=2, depths=(2, 1), samplings=(warmup.GREEDY,))
    try:
        while w.step():
            pass
        kept = store.read_warm_hint(info.path, info.dtype)
        assert kept["acceptance"] == w.acceptance() and len(w.acceptance()) >= 1
        assert kept["cost"]["7"] == {"1": 0.5}  # an earlier process's figure stays
        assert set(kept["cost"]["2"]) == {"1", "2"}
        assert store.read_warm_hint(info.path, "bfloat16" if info.dtype != "bfloat16"
                                    else "float32") is None
        fresh = Carryover.for_model(tiny_model)
        assert fresh.acceptance_hint == w.acceptance()
        assert set(fresh.cost_hints) == {1, 2, 7} and fresh.cost_hints[7] == {1: 0.5}
        path.write_text("{not json", encoding="utf-8")
        broken = Carryover.for_model(tiny_model)
        assert broken.acceptance_hint == [] and broken.cost_hints == {}
    finally:
        path.unlink(missing_ok=True)
        carryover_of(tiny_model).cost_hints.clear()
        carryover_of(tiny_model).acceptance_hint.clear()


def test_a_request_at_the_start_finds_the_scheduler_thread_free(tiny_model, monkeypatch):
    """A scheduler thread of its own (a server's) steps its warm-up only once no request has
    run for ``WARM_IDLE_S``: a request sent as the server starts listening begins before any
    warm-up step, and the warm-up still runs to its end once the thread is idle."""
    from engine.core import scheduler as sched_mod

    monkeypatch.setattr(sched_mod, "WARM_IDLE_S", 1.0)
    steps: list[float] = []
    sched = Scheduler(model=tiny_model, max_streams=2)
    sched.add_warmup_listener(lambda d, t: steps.append(time.monotonic()))
    sched.start()
    try:
        sched.wait_ready(30)
        _reply(sched, tiny_model)
        ended = time.monotonic()
        assert sched.warmup.done == 0 and not steps  # nothing of it ran before or during
        deadline = time.time() + 90
        while not sched.warmup.finished and time.time() < deadline:
            time.sleep(0.05)
        assert sched.warmup.finished and sched.warmup.done == sched.warmup.total
        assert steps and steps[0] - ended >= 0.9  # it waited for the idle second
    finally:
        sched.stop()
        carryover_of(tiny_model).cost_hints.clear()
        carryover_of(tiny_model).acceptance_hint.clear()


def test_warmup_compiles_prefills_together_first(tiny_model, monkeypatch):
    """Before its units, one step per row count from ``max_streams`` down to 2 prefills the
    warm-up's prompt that many times together (what a burst of new requests runs); those
    steps are not counted as shapes."""
    from engine.decoding import together

    calls = []
    real = together.prefill

    def spy(model, sessions, prompts, back):
        calls.append((len(sessions), len(prompts[0])))
        return real(model, sessions, prompts, back)
    monkeypatch.setattr(together, "prefill", spy)
    w = warmup.WarmUp(tiny_model, max_streams=3, depths=(1,), samplings=(warmup.GREEDY,))
    n = len(warmup._prompts(tiny_model)[0])
    assert w.step() and w.step() and w.done == 0
    assert calls == [(3, n), (2, n)]
    while w.step():
        pass
    assert w.finished and w.done == w.total == 3 and len(calls) == 2
    monkeypatch.setattr(together, "MIN_ROWS", 99)  # a model that cannot: no such steps
    w = warmup.WarmUp(tiny_model, max_streams=3, depths=(1,), samplings=(warmup.GREEDY,))
    while w.step():
        pass
    assert len(calls) == 2 and w.done == w.total


def test_hinted_costs_never_fall_with_depth(tiny_model):
    """A deeper cycle does all a shallower one does: hinted costs above a deeper depth's (a
    warm-up timed beside another process, or still compiling) are taken down to it, so a
    controller does not start out avoiding the depths in between. The one seen: 36 ms for
    depth 2 and 13 ms for depth 4 on one row, kept on disk for every later process."""
    from engine.core.carryover import Carryover, monotone_costs

    seen = {0: 0.0050, 1: 0.0079, 2: 0.0362, 3: 0.0303, 4: 0.0128}
    assert monotone_costs(seen) == {0: 0.0050, 1: 0.0079, 2: 0.0128, 3: 0.0128, 4: 0.0128}
    assert monotone_costs({0: 0.005, 1: 0.008, 3: 0.012}) == {0: 0.005, 1: 0.008, 3: 0.012}
    carry = Carryover()
    carry.hint({1: seen})
    costs = carry.controller(tiny_model, 1).costs()
    assert all(a <= b + 1e-12 for a, b in zip(costs, costs[1:])), costs


def test_hinted_costs_never_fall_with_the_batch_size():
    """A cycle over more rows does all one over fewer does: a hinted cost above a larger
    batch's at the same depth (timed while something else ran) is taken down to it. Seen on
    the demo: 6.7 ms for depth 0 at 3 rows against 5.1 at 4."""
    from engine.core.carryover import Carryover, monotone_rows

    seen = {1: {0: 0.0054, 3: 0.0135}, 2: {0: 0.0064, 3: 0.0149},
            3: {0: 0.0067, 3: 0.0176}, 4: {0: 0.0051, 3: 0.0205}, 5: {3: 0.0190}}
    assert monotone_rows(seen) == {1: {0: 0.0051, 3: 0.0135}, 2: {0: 0.0051, 3: 0.0149},
                                   3: {0: 0.0051, 3: 0.0176}, 4: {0: 0.0051, 3: 0.0190},
                                   5: {3: 0.0190}}
    carry = Carryover()
    carry.hint(seen)
    assert carry.cost_hints[3] == {0: 0.0051, 3: 0.0176}


def test_warmup_rows_ask_different_questions_and_keep_the_fastest_cycle(tiny_model,
                                                                        monkeypatch):
    """Each row of a unit asks the next of ``QUESTIONS`` (its acceptance is pooled over them),
    and a (rows, depth) cell's cost is the fastest of its timed cycles."""
    from engine.decoding.decoder import BatchDecoder

    asked: list[tuple[int, ...]] = []
    real_add = BatchDecoder.add

    def add(self, prompt_ids, **kw):
        asked.append(tuple(prompt_ids))
        return real_add(self, prompt_ids, **kw)
    monkeypatch.setattr(BatchDecoder, "add", add)
    w = warmup.WarmUp(tiny_model, max_streams=3, depths=(1,), samplings=(warmup.GREEDY,))
    while w.step():
        pass
    prompts = [tuple(p) for p in warmup._prompts(tiny_model)]
    assert len(set(prompts)) == len(warmup.QUESTIONS) == 4
    assert asked[:3] == prompts[:3]
    assert set(w.costs) == {1, 2, 3}
    for seconds in (0.020, 0.012, 0.030):
        w._timed(5, 3, seconds)
    assert w.costs[5] == {3: 0.012}
    carryover_of(tiny_model).cost_hints.clear()
    carryover_of(tiny_model).acceptance_hint.clear()
