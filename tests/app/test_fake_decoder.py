"""``ScriptedDecoder`` and ``FakeModel.decoder``: the decoder protocol the engine's scheduler
drives (``engine.decoding.decoder.BatchDecoder``'s), over the fake's scripted replies."""
from __future__ import annotations

import threading
import time

import pytest

from app.fake.decoder import ScriptedDecoder, StreamRequest
from app.fake.engine import DEFAULT_SCRIPT, FakeModel
from engine.errors import GenerationError
from engine.types import CycleStats, Event


def _drive(dec, on_step=None) -> tuple[dict[str, list[Event]], list[list[str]]]:
    """Step ``dec`` to the end: each stream's events, and which streams each cycle advanced."""
    events: dict[str, list[Event]] = {}
    cycles: list[list[str]] = []
    step = 0
    while dec.busy:
        for st, ev in dec.admit_step():
            events.setdefault(st.id, []).append(ev)
        out = dec.cycle_step()
        for st, ev in out:
            events.setdefault(st.id, []).append(ev)
        cycles.append([st.id for st, _ in out])
        step += 1
        if on_step is not None:
            on_step(step)
        assert step < 10_000
    return events, cycles


def _text(evs: list[Event]) -> str:
    return "".join(ev.text for ev in evs)


def test_streams_join_one_per_admit_step_and_interleave():
    fake = FakeModel(tokens_per_second=0, think=False)
    dec = fake.decoder(max_streams=2)
    a = dec.add([1, 2, 3], max_tokens=1000, depth="auto", id="a")
    b = dec.add([4, 5], max_tokens=1000, depth=0)
    assert a.id == "a" and isinstance(b.id, str) and b.id != "a"
    first = dec.admit_step()
    assert [(st.id, ev.prefill is not None) for st, ev in first] == [("a", True)]
    assert first[0][1].prefill.prompt_tokens == 3
    early = dec.cycle_step()
    assert [st.id for st, _ in early] == ["a"]  # b has not joined yet
    assert [st.id for st, _ in dec.admit_step()] == [b.id]
    events, cycles = _drive(dec)
    assert cycles[0] == ["a", b.id]  # one cycle advances every joined stream
    assert early[0][1].text + _text(events["a"]) == DEFAULT_SCRIPT
    assert _text(events[b.id]) == DEFAULT_SCRIPT
    assert events[b.id][-1].finish_reason == "stop"
    assert all(len(ev.token_ids) == 1 for ev in events[b.id][:-1] if ev.stats)  # depth 0
    both = [ev.stats for ev in events[b.id] if ev.stats and ev.stats.index < 3]
    assert all(s.batch_rows == 2 for s in both)
    assert [c["prompt_ids"] for c in fake.calls] == [[1, 2, 3], [4, 5]]


def test_room_and_busy_follow_the_streams():
    dec = FakeModel(tokens_per_second=0).decoder(max_streams=2)
    assert not dec.busy and dec.room == 2
    dec.add([1], max_tokens=3)
    assert dec.busy and dec.room == 1
    dec.add([1], max_tokens=3)
    assert dec.room == 0
    dec.admit_step()
    assert dec.room == 0  # joined streams count too
    _drive(dec)
    assert not dec.busy and dec.room == 2


def test_max_streams_one_runs_streams_one_after_the_other():
    dec = FakeModel(tokens_per_second=0).decoder(max_streams=1)
    a, b = dec.add([1], max_tokens=5), dec.add([2], max_tokens=5)
    events, cycles = _drive(dec)
    assert all(len(c) == 1 for c in cycles if c)
    a_cycles = [i for i, c in enumerate(cycles) if c == [a.id]]
    b_cycles = [i for i, c in enumerate(cycles) if c == [b.id]]
    assert max(a_cycles) < min(b_cycles)
    assert events[a.id][-1].finish_reason == events[b.id][-1].finish_reason == "length"


def test_cancel_mid_reply_ends_that_stream_only():
    dec = FakeModel(tokens_per_second=0).decoder(max_streams=4)
    cancel = threading.Event()
    doomed = dec.add([1], max_tokens=1000, cancel=cancel)
    kept = dec.add([2], max_tokens=1000)
    events, _ = _drive(dec, on_step=lambda step: step == 5 and cancel.set())
    assert events[doomed.id][-1] == Event(token_ids=(), finish_reason="cancelled")
    assert 0 < len(_text(events[doomed.id])) < len(DEFAULT_SCRIPT)
    assert _text(events[kept.id]) == DEFAULT_SCRIPT
    waiting = dec.add([3], cancel=cancel)  # cancelled before it joined: no prefill
    assert dec.admit_step() == [(waiting, Event(token_ids=(), finish_reason="cancelled"))]
    assert not dec.busy
    joined, queued = dec.add([4]), dec.add([5])
    dec.admit_step()
    assert dec.close() == [(queued, Event(token_ids=(), finish_reason="cancelled")),
                           (joined, Event(token_ids=(), finish_reason="cancelled"))]
    assert not dec.busy and dec.room == 4


def test_concurrent_replies_take_about_as_long_as_one():
    def timed(n: int) -> float:
        dec = FakeModel(tokens_per_second=1000, repeat_to=150).decoder(max_streams=n)
        for _ in range(n):
            dec.add([1], max_tokens=1000, seed=7)
        t0 = time.perf_counter()
        _drive(dec)
        return time.perf_counter() - t0

    one, four = timed(1), timed(4)
    assert one > 0.04  # 150 tokens at 1000 tok/s, in fewer cycles than tokens
    assert four < 1.6 * one + 0.05


def test_generate_yields_what_a_one_stream_decoder_does():
    fake = FakeModel(tokens_per_second=0)
    gen = list(fake.generate([1, 2], max_tokens=40, depth=2, seed=3))
    dec = fake.decoder(max_streams=1)
    dec.add([1, 2], max_tokens=40, depth=2, seed=3)
    events, _ = _drive(dec)
    assert gen == next(iter(events.values()))
    assert gen[0].prefill is not None and gen[-1].finish_reason == "length"
    assert fake.calls[0]["depth"] == 2 and fake.calls[0]["max_tokens"] == 40


def test_a_failing_script_raises_from_the_cycle():
    fake = FakeModel(tokens_per_second=0, fail_after=5, error=GenerationError("boom"))
    with pytest.raises(GenerationError, match="boom"):
        list(fake.generate([1], max_tokens=100))


def test_scripted_decoder_is_generic():
    seen: list[StreamRequest] = []

    def start(req: StreamRequest):
        if req.max_tokens < 1:
            raise GenerationError("max_tokens must be at least 1")
        seen.append(req)
        stats = CycleStats(index=0, depth=0, drafted=(), accepted=0, emitted=(7,),
                           from_draft=(False,), extra_kind="plain")
        return iter([Event(token_ids=()), Event(token_ids=(7,), text="x", stats=stats)])

    paced = []
    dec = ScriptedDecoder(start, max_streams=2, pace=lambda evs: paced.append(len(evs)))
    with pytest.raises(GenerationError):
        dec.add([1], max_tokens=0)
    st = dec.add([1, 2], stop_strings=["\n"], seed=4)
    assert seen[0].prompt_ids == (1, 2) and seen[0].stop_strings == ("\n",) and seen[0].seed == 4
    events, _ = _drive(dec)
    # the iterator ran out after its one cycle: the stream ends with "stop"
    assert [ev.finish_reason for ev in events[st.id]] == [None, None, "stop"]
    assert paced == [1, 1]
    with pytest.raises(GenerationError):
        ScriptedDecoder(start, max_streams=0)
