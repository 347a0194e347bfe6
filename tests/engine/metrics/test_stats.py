"""StatsAggregator: exact numbers from scripted cycles."""
from __future__ import annotations

import pytest

from engine.metrics.stats import MEMORY_PERIOD_S, MemorySample, StatsAggregator, TimeSplit
from engine.types import CycleStats, PrefillStats


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def cycle(index: int, depth: int, accepted: int, *, t: float = 0.1, ctx: int = 0,
          split=(0.0, 0.0, 0.0, 0.0), reason: str = "") -> CycleStats:
    """A cycle drafting ``depth`` tokens, ``accepted`` of them kept, plus one more token."""
    if depth == 0:
        kind = "plain"
    else:
        kind = "bonus" if accepted == depth else "correction"
    drafted = tuple(range(100, 100 + depth))
    emitted = drafted[:accepted] + (7,)
    return CycleStats(index=index, depth=depth, drafted=drafted, accepted=accepted,
                      emitted=emitted, from_draft=(True,) * accepted + (False,),
                      extra_kind=kind, t_draft=split[0], t_verify=split[1], t_accept=split[2],
                      t_commit=split[3], t_total=t, context_tokens=ctx, depth_reason=reason)


def agg_with(clock, probe=None) -> StatsAggregator:
    return StatsAggregator(window_s=10.0, clock=clock, memory_probe=probe)


def test_acceptance_by_position_counts_and_rates():
    clock = FakeClock()
    agg = agg_with(clock)
    agg.add_prefill(PrefillStats(prompt_tokens=50, reused_tokens=10, seconds=0.2))
    script = [(3, 3), (3, 1), (3, 0), (2, 2), (0, 0)]  # (depth, accepted)
    for i, (d, a) in enumerate(script):
        agg.add_cycle(cycle(i, d, a, ctx=51 + i))
    s = agg.snapshot()
    # position 1: drafted in 4 cycles, judged in all 4, accepted in 2 (3/3, 3/1 -> yes; 3/0 no; 2/2 yes)
    p1, p2, p3 = s.positions
    assert (p1.drafted, p1.reached, p1.accepted) == (4, 4, 3)
    assert (p2.drafted, p2.reached, p2.accepted) == (4, 3, 2)
    assert (p3.drafted, p3.reached, p3.accepted) == (3, 1, 1)
    assert p1.rate == pytest.approx(3 / 4) and p2.conditional == pytest.approx(2 / 3)
    assert p3.rate == pytest.approx(1 / 3) and p3.conditional == pytest.approx(1.0)
    assert s.accepted_hist == (1, 1, 1, 1)  # lengths 0, 1, 2, 3 once each
    assert s.spec_cycles == 4
    assert s.accepted_mean == pytest.approx((3 + 1 + 0 + 2) / 4)
    assert s.tokens == 4 + 2 + 1 + 3 + 1
    assert s.tokens_per_cycle == pytest.approx(11 / 5)
    assert (s.corrections, s.bonuses, s.plain) == (2, 2, 1)
    assert s.context_tokens == 55
    assert s.current_depth == 0
    assert [p.depth for p in s.depth_history] == [3, 3, 3, 2, 0]
    assert s.ttft_s == pytest.approx(0.2)
    assert s.prefill_tps == pytest.approx(40 / 0.2)
    assert s.reused_tokens == 10 and s.prompt_tokens == 50


def test_smoothed_rate_is_bias_corrected_ewma():
    clock = FakeClock()
    agg = agg_with(clock)
    agg.add_cycle(cycle(0, 1, 1))
    assert agg.snapshot().positions[0].smoothed == pytest.approx(1.0)
    agg.add_cycle(cycle(1, 1, 0))
    # weights 0.9*0.1 (old) and 0.1 (new): (0.09 * 1 + 0.1 * 0) / (0.09 + 0.1)
    assert agg.snapshot().positions[0].smoothed == pytest.approx(0.09 / 0.19)


def test_rates_instant_and_window():
    clock = FakeClock()
    agg = agg_with(clock)
    # 30 cycles of 0.05 s emitting 2 tokens each (40 tok/s), 1 s apart in wall time
    for i in range(30):
        agg.add_cycle(cycle(i, 1, 1, t=0.05))
        clock.t += 1.0
    # then 20 cycles of 0.1 s with 1 token (10 tok/s), same wall second
    for i in range(20):
        agg.add_cycle(cycle(30 + i, 0, 0, t=0.1))
    s = agg.snapshot()
    assert s.tps_instant == pytest.approx(10.0)  # last 10 cycles = 1.0 s of decode
    # window 10 s: cycles at t >= now-10 -> the 10 fast ones at now-10..now-1 plus 20 slow ones
    assert s.tps_window == pytest.approx((10 * 2 + 20) / (10 * 0.05 + 20 * 0.1))
    assert s.decode_seconds == pytest.approx(30 * 0.05 + 20 * 0.1)
    # series: one point per 1 s bucket inside the window; last bucket is the slow one
    assert s.tps_series[-1][1] == pytest.approx(10.0)
    assert s.tps_series[0][1] == pytest.approx(40.0)
    assert len(s.tps_series) == 11  # buckets now-10 .. now
    clock.t += 100.0
    s = agg.snapshot()
    assert s.tps_window == 0.0 and s.tps_series == ()
    assert s.tps_instant == pytest.approx(10.0)  # instant keeps the last value when idle


def test_time_split_recent_and_total():
    clock = FakeClock()
    agg = agg_with(clock)
    agg.add_cycle(cycle(0, 2, 1, t=0.10, split=(0.01, 0.06, 0.01, 0.01)))
    agg.add_cycle(cycle(1, 2, 2, t=0.12, split=(0.02, 0.07, 0.01, 0.01)))
    s = agg.snapshot()
    assert s.time_total.draft == pytest.approx(0.03)
    assert s.time_total.verify == pytest.approx(0.13)
    assert s.time_total.other == pytest.approx(0.01 + 0.01)
    assert s.time_recent.verify == pytest.approx(0.065)
    assert s.time_recent.total == pytest.approx(0.11)
    assert not s.profiled
    agg.add_cycle(CycleStats(index=2, depth=0, drafted=(), accepted=0, emitted=(1,),
                             from_draft=(False,), extra_kind="plain", t_total=0.1, host_syncs=4))
    assert agg.snapshot().profiled
    assert TimeSplit().total == 0.0


def test_time_split_keeps_the_sync_wait_apart():
    """Unprofiled cycles report the wait on their one host sync as ``t_sync``: it goes to
    ``TimeSplit.sync``, not to a phase and not to ``other``."""
    agg = agg_with(FakeClock())
    c = CycleStats(index=0, depth=2, drafted=(1, 2), accepted=1, emitted=(1, 9),
                   from_draft=(True, False), extra_kind="correction", t_draft=0.001,
                   t_verify=0.002, t_accept=0.001, t_commit=0.001, t_sync=0.04, t_total=0.05)
    agg.add_cycle(c)
    s = agg.snapshot()
    for split in (s.time_total, s.time_recent):
        assert split.sync == pytest.approx(0.04)
        assert split.accept == pytest.approx(0.001)
        assert split.other == pytest.approx(0.005)
        assert split.total == pytest.approx(0.05)


def test_requests_and_finish_summary():
    clock = FakeClock()
    agg = agg_with(clock)
    agg.add_prefill(PrefillStats(prompt_tokens=20, reused_tokens=0, seconds=0.5))
    agg.add_cycle(cycle(0, 2, 2, t=0.1))
    agg.add_cycle(cycle(1, 2, 0, t=0.1))
    assert agg.snapshot().active
    summary = agg.finish("length")
    assert summary["tokens"] == 4 and summary["cycles"] == 2
    assert summary["tokens_per_second"] == pytest.approx(20.0)
    assert summary["ttft_s"] == pytest.approx(0.5)
    assert summary["accepted_per_cycle"] == pytest.approx(1.0)
    assert summary["acceptance"] == pytest.approx(2 / 4)
    s = agg.snapshot()
    assert not s.active and s.last_finish_reason == "length" and s.requests == 1
    agg.add_prefill(PrefillStats(prompt_tokens=30, reused_tokens=20, seconds=0.1))
    agg.add_cycle(cycle(0, 0, 0, t=0.05))
    summary = agg.finish("stop")
    assert summary["tokens"] == 1 and summary["acceptance"] is None
    s = agg.snapshot()
    assert s.requests == 2 and s.tokens == 5  # session totals keep both requests
    assert s.context_tokens == 30  # the new prompt, no context given by the cycle


def test_memory_sampled_at_most_every_period():
    clock = FakeClock()
    calls = []

    def probe():
        calls.append(clock.t)
        return MemorySample(len(calls), 2 * len(calls), 3, clock.t)

    agg = agg_with(clock, probe)
    for i in range(20):
        agg.add_cycle(cycle(i, 1, 0, t=0.01))
        clock.t += 0.1
        agg.snapshot()
    # 2.0 s of clock, a sample at most every 0.5 s
    assert len(calls) == pytest.approx(2.0 / MEMORY_PERIOD_S, abs=1)
    assert all(b - a >= MEMORY_PERIOD_S - 1e-9 for a, b in zip(calls, calls[1:]))
    assert agg.snapshot().memory.active_bytes == len(calls)


def test_broken_memory_probe_is_dropped_not_raised(caplog):
    def probe():
        raise RuntimeError("boom")

    agg = agg_with(FakeClock(), probe)
    agg.add_cycle(cycle(0, 1, 1))
    assert agg.snapshot().memory is None
    assert "memory probe failed" in caplog.text


def test_real_memory_probe_reads_rss():
    from engine.metrics.stats import read_memory

    m = read_memory()
    assert m.rss_bytes is not None and m.rss_bytes > 0


def test_acceptance_by_context_band():
    """Speculative cycles are tallied by the context they ran at, so a head that falls off as
    a conversation grows shows it (plain cycles are not drafting and are left out)."""
    from engine.metrics.stats import CONTEXT_EDGES, context_band

    assert [context_band(n) for n in (0, 2047, 2048, 8191, 8192, 40_000, 10**6)] == \
        [0, 0, 1, 1, 2, 3, 4]
    agg = agg_with(FakeClock())
    for i, (d, a, ctx) in enumerate([(3, 3, 100), (3, 2, 1500), (3, 0, 3000), (3, 1, 9000),
                                     (0, 0, 9100), (2, 2, 200_000)]):
        agg.add_cycle(cycle(i, d, a, ctx=ctx))
    bands = agg.snapshot().by_context
    assert [(b.lo, b.hi) for b in bands] == [(0, 2048), (2048, 8192), (8192, 32768),
                                              (131072, None)]
    assert [b.label for b in bands] == ["0–2k", "2k–8k", "8k–32k", "≥128k"]
    assert [(b.cycles, b.drafted, b.accepted, b.emitted) for b in bands] == \
        [(2, 6, 5, 7), (1, 3, 0, 1), (1, 3, 1, 2), (1, 2, 2, 3)]
    assert bands[0].tokens_per_cycle == pytest.approx(3.5)
    assert bands[0].acceptance == pytest.approx(5 / 6)
    assert len(CONTEXT_EDGES) == 4
