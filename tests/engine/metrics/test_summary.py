"""engine.metrics.summary: one reply's figures, with exact numbers on hand-made events."""
from __future__ import annotations

import pytest

from engine.metrics.stats import StatsAggregator
from engine.metrics.summary import (
    PositionCounts,
    PositionTally,
    ReplyTally,
    position_counts,
    round_rates,
    summarize,
    summarize_cycles,
)
from engine.types import CycleStats, Event, PrefillStats


def cycle(index, depth, accepted, *, t=0.1, syncs=1, emitted=None):
    drafted = tuple(range(100, 100 + depth))
    if emitted is None:
        emitted = drafted[:accepted] + (7,)
    kind = "plain" if depth == 0 else ("bonus" if accepted == depth else "correction")
    return CycleStats(index=index, depth=depth, drafted=drafted, accepted=accepted,
                      emitted=tuple(emitted), from_draft=(True,) * accepted + (False,),
                      extra_kind=kind, t_total=t, host_syncs=syncs)


def reply_events():
    """Prefill (first token), then cycles at depths 3, 3, 2, 0, 3 with 3, 1, 0, 0, 2 accepted;
    the last cycle ends the reply on its second accepted draft (EOS)."""
    yield Event(token_ids=(5,), text="a", prefill=PrefillStats(40, 30, 0.25))
    yield Event(token_ids=(100, 101, 102, 7), text="b", stats=cycle(1, 3, 3, t=0.2))
    yield Event(token_ids=(100, 7), text="c", stats=cycle(2, 3, 1, t=0.1))
    yield Event(token_ids=(7,), text="d", stats=cycle(3, 2, 0, t=0.1))
    yield Event(token_ids=(7,), text="e", stats=cycle(4, 0, 0, t=0.05))
    yield Event(token_ids=(100, 101), text="f", finish_reason="stop",
                stats=cycle(5, 3, 2, t=0.15, emitted=(100, 101)))


def test_reply_summary_exact_numbers():
    s = summarize(reply_events())
    assert s.tokens == 11 and s.decode_tokens == 10
    assert (s.prompt_tokens, s.reused_tokens, s.ttft_s) == (40, 30, 0.25)
    assert s.decode_s == pytest.approx(0.6)
    assert s.tokens_per_s == pytest.approx(10 / 0.6)
    assert s.cycles == 5 and s.speculative_cycles == 4
    assert (s.drafted, s.accepted) == (11, 6)
    assert s.tokens_per_cycle == pytest.approx(2.0)
    assert s.accepted_per_cycle == pytest.approx(6 / 5)
    assert s.draft_acceptance == pytest.approx(6 / 11)
    assert (s.depth_min, s.depth_max) == (2, 3)
    assert s.host_syncs == 5 and s.host_syncs_per_cycle == 1.0
    assert s.finish_reason == "stop"
    # position 1: drafted by 4 cycles, all reached, accepted in 3 (3/3, 3/1, 3/2)
    # position 2: drafted 4, reached 3 (not the 2/0 cycle), accepted 2 (3/3, 3/2)
    # position 3: drafted 3, reached 2 (3/3 and 3/2), accepted 1
    assert s.positions == (PositionCounts(1, 4, 4, 3), PositionCounts(2, 4, 3, 2),
                           PositionCounts(3, 3, 2, 1))
    assert [p.rate for p in s.positions] == [0.75, 0.5, pytest.approx(1 / 3)]
    assert [p.conditional for p in s.positions] == [0.75, pytest.approx(2 / 3), 0.5]
    d = s.to_dict()
    assert d["acceptance_rate_by_position"] == [p.rate for p in s.positions]
    assert d["conditional_acceptance_by_position"] == [p.conditional for p in s.positions]
    assert d["tokens_per_s"] == s.tokens_per_s


def test_tally_keeps_text_tokens_and_finish():
    t = ReplyTally()
    for ev in reply_events():
        t.add(ev)
    assert t.text == "abcdef" and t.token_ids[:2] == [5, 100] and len(t.token_ids) == 11
    assert t.finish_reason == "stop" and t.summary() == summarize(reply_events())


def test_empty_and_plain_replies():
    s = summarize([])
    assert (s.tokens, s.cycles, s.tokens_per_s, s.tokens_per_cycle) == (0, 0, 0.0, 0.0)
    assert s.draft_acceptance is None and s.positions == () and s.finish_reason is None
    plain = summarize([Event(token_ids=(1,), prefill=PrefillStats(3, 0, 0.1)),
                       Event(token_ids=(2,), stats=cycle(1, 0, 0, t=0.5)),
                       Event(token_ids=(3,), stats=cycle(2, 0, 0, t=0.5), finish_reason="length")])
    assert plain.tokens_per_s == pytest.approx(2.0) and plain.positions == ()
    assert (plain.depth_min, plain.depth_max, plain.speculative_cycles) == (0, 0, 0)


def test_position_counts_one_definition():
    cycles = [e.stats for e in reply_events() if e.stats]
    tally = PositionTally()
    for c in cycles:
        tally.add(c)
    assert tally.counts() == position_counts(cycles) == summarize(reply_events()).positions
    assert position_counts(cycles, max_depth=2) == position_counts(cycles)[:2]
    pooled = summarize_cycles(cycles)
    assert pooled.tokens == pooled.decode_tokens == 10 and pooled.ttft_s == 0.0
    assert round_rates([1 / 3, None]) == [0.3333, None]


def test_stats_aggregator_agrees_with_the_summary():
    """The dashboard's aggregator and the summary give the same per-position counts and the
    same tok/s and acceptance for the same reply."""
    agg = StatsAggregator(window_s=10.0, clock=lambda: 0.0, memory_probe=None)
    for ev in reply_events():
        if ev.prefill:
            agg.add_prefill(ev.prefill)
        if ev.stats:
            agg.add_cycle(ev.stats)
    snap = agg.snapshot()
    s = summarize(reply_events())
    assert [(p.position, p.drafted, p.reached, p.accepted) for p in snap.positions] == \
        [(p.position, p.drafted, p.reached, p.accepted) for p in s.positions]
    assert [p.rate for p in snap.positions] == [p.rate for p in s.positions]
    done = agg.finish("stop")
    assert agg.last_reply.positions == s.positions
    assert done["tokens_per_second"] == pytest.approx(s.tokens_per_s)
    assert done["acceptance"] == pytest.approx(s.draft_acceptance)
    assert done["accepted_per_cycle"] == pytest.approx(s.accepted_per_cycle)
    assert done["tokens_per_cycle"] == pytest.approx(s.tokens_per_cycle)


def test_generate_json_report_comes_from_the_summary():
    from engine.commands.generate import json_report

    t = ReplyTally()
    for ev in reply_events():
        t.add(ev)
    s = t.summary()
    d = json_report(t, trace=True)
    st = d["stats"]
    assert d["finish_reason"] == "stop" and d["text"] == "abcdef"
    assert st["tokens"] == s.tokens and st["cycles"] == 5 and st["speculative_cycles"] == 4
    assert st["decode_tokens_per_s"] == round(s.tokens_per_s, 3)
    assert (st["drafted"], st["accepted"]) == (11, 6)
    assert st["acceptance_rate_by_position"] == [0.75, 0.5, 0.3333]
    assert st["conditional_acceptance_by_position"] == [0.75, 0.6667, 0.5]
    assert "acceptance_by_position" not in st  # ambiguous: both kinds are named instead
    assert len(d["trace"]) == 5
