"""Recorded workloads (``engine.bench.adaptive_traces``): replies replay what real cycles accepted,
by where in the reply each cycle starts; the demo model's recording ships and loads; the
recorder writes what it saw."""
from __future__ import annotations

import json
import random

import pytest

from engine.bench import adaptive_sim as sim
from engine.bench.adaptive_traces import conditional, default_path, record, workloads
from engine.types import SamplingParams


def test_a_cycle_replays_the_recorded_cycle_that_started_at_or_before_it():
    r = sim.Reply((0.9, 0.8), length=20, trace=(4, 1, 0, 3))  # recorded starts 0, 5, 7, 8
    got = [r.recorded_at(p) for p in (0, 4, 5, 6, 7, 8, 100)]
    assert got == [4, 4, 1, 1, 0, 3, 3]


def test_the_recorded_depth_replays_its_recording_exactly():
    trace, length = (4, 2, 0, 4, 1), 16  # 1 + 5 + 3 + 1 + 5 + 2 = 17 > 16: the last is cut
    w = sim.Workload("one", {"only": (0.5,) * 4}, noise=0.0, spikes=0.0, load=0.0,
                     recorded={"only": ((trace, length),)})
    replies = sim.replies_for(w, "only", 2, random.Random(0))
    assert all(r.trace == trace and r.length == length for r in replies)
    out = sim.run_replies(sim.Fixed(4), replies, w, max_tokens=64)
    assert out.depths[4] == 2 * len(trace) and out.tokens == 2 * (length - 1)
    assert out.seconds == pytest.approx(2 * len(trace) * w.cost[4])
    # depth 1 accepts a draft wherever the recording accepted at least one
    one = sim.run_replies(sim.Fixed(1), replies[:1], w, max_tokens=64)
    assert one.tokens == length - 1 and one.depths[1] > len(trace)


def test_conditional_acceptance_counts_positions_reached():
    # cycles (2, 0, 4): position 1 reached 3x accepted 2x, 2 reached 2x accepted 2x, ...
    assert conditional([[[2, 0], 9], [[4], 6]]) == (round(2 / 3, 3), 1.0, 0.5, 1.0)


def test_the_demo_recording_ships_and_loads():
    data = json.loads(default_path().read_text())
    ws = {w.name: w for w in workloads()}
    assert set(ws) == set(data["workloads"]) == {"recorded-demo-T0", "recorded-demo-T0.7"}
    for name, w in ws.items():
        assert w.cost[0] == 1.0 and list(w.cost) == sorted(w.cost) and w.max_depth == 4
        assert set(w.recorded) == {"in-domain", "out-of-domain"}
        for cls, traces in w.recorded.items():
            assert len(traces) >= 6 and all(0 <= a <= 4 for t, _ in traces for a in t)
            assert w.classes[cls] == conditional(data["workloads"][name]["classes"][cls])
    assert workloads(default_path().with_name("missing.json")) == []


@pytest.mark.parametrize("text", ["{not json", "[]", '{"workloads": {"x": {"cost": [1]}}}',
                                  '{"workloads": {"x": {"classes": {"a": [[["y"], 3]]}, '
                                  '"cost": [1.0, 2.0]}}}'])
def test_a_broken_recording_is_ignored(tmp_path, caplog, text):
    bad = tmp_path / "traces.json"
    bad.write_text(text)
    assert workloads(bad) == []
    assert "ignoring the recorded workloads" in caplog.text


def test_auto_on_the_recorded_workloads_is_reported(capsys):
    # what ``bench --simulate`` prints for them: a figure per class, no worse than the
    # shallowest speculative depth
    for w in workloads():
        r = sim.compare(w, "mixed", runs=1, replies=8, max_tokens=96)
        assert r["ratio"] >= r["fixed"][1] / r["fixed"][r["best"]] - 0.02, (w.name, r)


def test_record_keeps_each_cycle_of_the_deepest_depth(tiny_model):
    prompts = {"a": ["Explain a hash table."], "b": ["def f(x): return x"]}
    got = record(tiny_model, prompts, SamplingParams(temperature=0.0), depth=2, max_tokens=10)
    assert set(got["classes"]) == {"a", "b"} and got["cost"][0] == 1.0 and len(got["cost"]) == 3
    for traces in got["classes"].values():
        assert len(traces) == 1  # greedy: one seed
        cycles, tokens = traces[0]
        assert cycles and all(0 <= a <= 2 for a in cycles)
        assert sum(a + 1 for a in cycles) < tokens <= 10
