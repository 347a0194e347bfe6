"""AdaptiveDepth on simulated workloads: per-position acceptance + cost t(d) = c0 + c1*d."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from engine.core.carryover import carryover_of
from engine.depth.controller import AdaptiveDepth
from engine.types import CycleStats

HIGH = (0.92, 0.85, 0.8, 0.7)  # conditional acceptance by position
LOW = (0.25, 0.2, 0.2, 0.2)
MID = (0.7, 0.5, 0.4, 0.3)
STEP = (0.9, 0.85, 0.25, 0.2)
ALL95 = (0.95,) * 4
REASONS = {"warmup", "explore", "best score", "switch", "hold (hysteresis)"}


def expected_tokens(p, d: int) -> float:
    e = run = 1.0
    for i in range(d):
        run *= p[i]
        e += run
    return e


def fixed_rate(phases, d: int) -> float:
    """Expected tokens/s of always using depth d over ``phases`` [(p, c0, c1, cycles)]."""
    tokens = sum(expected_tokens(p, d) * n for p, c0, c1, n in phases)
    seconds = sum((c0 + c1 * d) * n for p, c0, c1, n in phases)
    return tokens / seconds


def best_fixed(p, c0, c1, max_depth=4) -> tuple[int, float]:
    """The best depth and how much it beats the runner-up (ratio - 1)."""
    rates = sorted(((fixed_rate([(p, c0, c1, 1)], d), d) for d in range(max_depth + 1)),
                   reverse=True)
    return rates[0][1], rates[0][0] / rates[1][0] - 1


def cycle_stats(d: int, accepted: int, t: float) -> CycleStats:
    drafted = tuple(range(10, 10 + d))
    kind = "plain" if d == 0 else ("bonus" if accepted == d else "correction")
    return CycleStats(index=0, depth=d, drafted=drafted, accepted=accepted,
                      emitted=drafted[:accepted] + (1,), from_draft=(True,) * accepted + (False,),
                      extra_kind=kind, t_total=t)


def simulate(ctrl, phases, *, seed: int, noise: float = 0.05, request_every: int | None = None):
    """Run the controller; returns (tokens/s achieved, [(depth, reason)] per cycle)."""
    rng = random.Random(seed)
    tokens = seconds = 0.0
    trace = []
    for p, c0, c1, n in phases:
        for _ in range(n):
            if request_every and trace and len(trace) % request_every == 0:
                ctrl.new_request()
            d, reason = ctrl.choose()
            accepted = 0
            while accepted < d and rng.random() < p[accepted]:
                accepted += 1
            t = (c0 + c1 * d) * (1 + noise * (2 * rng.random() - 1))
            ctrl.observe(cycle_stats(d, accepted, t))
            tokens += accepted + 1
            seconds += t
            trace.append((d, reason))
    return tokens / seconds, trace


def settled(trace) -> Counter:
    """Depths the controller chose on its own (not exploring), over the last 100 cycles."""
    return Counter(d for d, r in trace[-100:] if r != "explore")


@pytest.mark.parametrize("p,c1,best", [(HIGH, 0.001, 4), (STEP, 0.004, 2), (MID, 0.008, 1),
                                        (LOW, 0.003, 1), (LOW, 0.008, 0)])
def test_converges_to_the_best_depth(p, c1, best):
    assert best_fixed(p, 0.02, c1) == (best, pytest.approx(0.09, abs=0.035))  # a clear winner
    for seed in range(3):
        _, trace = simulate(AdaptiveDepth(4, seed=seed), [(p, 0.02, c1, 400)], seed=seed + 50)
        assert settled(trace).most_common(1)[0][0] == best
        assert {r for _, r in trace} <= REASONS


@pytest.mark.parametrize("p,c1", [(HIGH, 0.003), (LOW, 0.008), (MID, 0.004)])
def test_throughput_close_to_the_best_fixed_depth(p, c1):
    phases = [(p, 0.02, c1, 400)]
    best = max(fixed_rate(phases, d) for d in range(5))
    achieved = [simulate(AdaptiveDepth(4, seed=s), phases, seed=s + 7)[0] for s in range(4)]
    assert sum(achieved) / len(achieved) > 0.96 * best


def test_switches_when_acceptance_shifts_mid_stream():
    c0, c1 = 0.02, 0.008

    def good(p):  # depths within 6% of the best fixed depth for acceptance p
        rates = [fixed_rate([(p, c0, c1, 1)], d) for d in range(5)]
        return {d for d, r in enumerate(rates) if r >= 0.94 * max(rates)}

    assert good(ALL95) == {3, 4} and good(LOW) == {0}
    phases = [(ALL95, c0, c1, 300), (LOW, c0, c1, 300), (ALL95, c0, c1, 300)]

    def share(own, lo, hi, ok):
        chosen = [d for i, d in own if lo <= i < hi]
        return sum(d in ok for d in chosen) / len(chosen)

    for seed in range(4):
        rate, trace = simulate(AdaptiveDepth(4, seed=seed), phases, seed=seed)
        own = [(i, d) for i, (d, r) in enumerate(trace) if r != "explore"]
        assert share(own, 100, 300, good(ALL95)) > 0.9
        # acceptance collapses at cycle 300: down to depth 0 within 50 cycles, and it stays
        assert next(i for i, d in own if i >= 300 and d == 0) < 350
        assert share(own, 350, 600, good(LOW)) > 0.8  # seeds 0-39: median 0.98, least 0.83
        # and recovers at 600 (slower: at depth 0 only probes see acceptance)
        assert next(i for i, d in own if i >= 600 and d in good(ALL95)) < 720
        assert share(own, 720, 900, good(ALL95)) > 0.9
        assert rate > 1.1 * max(fixed_rate(phases, d) for d in range(5))


def test_beats_every_fixed_depth_on_an_alternating_workload():
    # in-domain and out-of-domain prompts alternate: no single depth suits both
    phases = [(HIGH, 0.02, 0.006, 80), (LOW, 0.02, 0.006, 80)] * 6
    best_fixed_rate = max(fixed_rate(phases, d) for d in range(5))
    achieved = [simulate(AdaptiveDepth(4, seed=s), phases, seed=s, request_every=80)[0]
                for s in range(3)]
    assert min(achieved) > 1.03 * best_fixed_rate


def test_warmup_visits_every_depth_then_decides():
    ctrl = AdaptiveDepth(3, seed=0)
    assert ctrl.warmup == 8
    depths = []
    for _ in range(8):
        d, reason = ctrl.choose()
        assert reason == "warmup"
        depths.append(d)
        ctrl.observe(cycle_stats(d, d, 0.01 + 0.001 * d))
    assert depths == [3, 0, 1, 2, 3, 0, 1, 2]
    assert ctrl.choose()[1] != "warmup"


def test_same_seed_same_observations_same_depths():
    phases = [(MID, 0.02, 0.004, 200)]
    _, a = simulate(AdaptiveDepth(4, seed=3), phases, seed=9)
    _, b = simulate(AdaptiveDepth(4, seed=3), phases, seed=9)
    assert a == b
    _, c = simulate(AdaptiveDepth(4, seed=4), phases, seed=9)
    assert a != c  # the controller's own RNG drives exploration


def test_costs_of_unseen_depths_follow_a_fitted_line():
    ctrl = AdaptiveDepth(4, seed=0)
    for _ in range(5):
        ctrl.observe(cycle_stats(0, 0, 0.010))
        ctrl.observe(cycle_stats(4, 0, 0.018))
    costs = ctrl.costs()
    assert costs == pytest.approx([0.010, 0.012, 0.014, 0.016, 0.018])


def test_one_timed_depth_uses_a_prior_slope():
    ctrl = AdaptiveDepth(2, seed=0)
    ctrl.observe(cycle_stats(0, 0, 0.010))
    assert ctrl.costs() == [0.0, 0.0, 0.0]  # a depth's first timing is held back...
    ctrl.observe(cycle_stats(0, 0, 0.010))  # ...until its second
    costs = ctrl.costs()
    assert costs[0] == pytest.approx(0.010) and costs[1] > costs[0] and costs[2] > costs[1]


def test_a_first_cycle_that_compiles_does_not_set_the_costs():
    # measured on the demo after loading: the first cycle took 17.5 s (the process compiled
    # the model's graphs), the next ones 10-40 ms; it used to set the cost level, and every
    # depth's cost stayed wrong for ~100 cycles
    ctrl = AdaptiveDepth(2, seed=0)
    ctrl.observe(cycle_stats(2, 2, 17.5))
    for _ in range(3):
        for d in (0, 1, 2):
            ctrl.observe(cycle_stats(d, d, 0.010 * (1 + 0.5 * d)))
    assert ctrl.costs() == pytest.approx([0.010, 0.015, 0.020], rel=1e-6)
    slow = AdaptiveDepth(2, seed=0)  # the second timing compiled instead: the faster counts
    slow.observe(cycle_stats(1, 1, 0.015))
    slow.observe(cycle_stats(1, 1, 3.0))
    assert slow.costs()[1] == pytest.approx(0.015)


def test_a_seeded_controller_holds_back_its_first_cycles_too():
    init = {"acceptance": [0.9, 0.9], "cost": {"0": 0.010, "1": 0.015, "2": 0.020}, "depth": 2}
    ctrl = AdaptiveDepth(2, seed=0, initial=init)
    ctrl.observe(cycle_stats(2, 2, 3.0))  # the process compiles its graphs
    ctrl.observe(cycle_stats(1, 1, 0.0255))  # a new verify shape: 1.7x
    assert ctrl.costs() == pytest.approx([0.010, 0.015, 0.020])


def test_a_depth_past_a_worse_neighbour_is_probed():
    # depth 2 costs as much as depth 3 (a 3-token verify can cost far more than a 2-token
    # one): from depth 1, the promising depth is 3, past a neighbour that cannot win
    init = {"acceptance": [0.95, 0.95, 0.95], "cost": {"0": 0.010, "1": 0.014, "2": 0.025,
                                                        "3": 0.0268}, "depth": 1}
    ctrl = AdaptiveDepth(3, seed=0, explore=0.5, explore_min=0.5, initial=init)
    ctrl._incumbent = 1
    scores, hopeful = ctrl.scores(), ctrl.optimistic_scores()
    assert hopeful[2] < scores[1] < hopeful[3]
    probes = Counter(d for d, why in (ctrl.choose() for _ in range(20)) if why == "explore")
    assert set(probes) == {3} and probes[3] >= 5


def test_the_cost_level_follows_a_lasting_change_at_once():
    ctrl = AdaptiveDepth(1, seed=0)
    for _ in range(10):
        ctrl.observe(cycle_stats(0, 0, 0.010))
    for _ in range(2):  # twice as slow: clipped, like a GC pause...
        ctrl.observe(cycle_stats(0, 0, 0.020))
    assert ctrl.costs()[0] < 0.012
    ctrl.observe(cycle_stats(0, 0, 0.020))  # ...a third time in a row: other load started
    assert ctrl.costs()[0] == pytest.approx(0.020, rel=0.1)
    for _ in range(3):
        ctrl.observe(cycle_stats(0, 0, 0.010))  # and stopped
    assert ctrl.costs()[0] == pytest.approx(0.010, rel=0.1)


def test_outlier_cycle_times_are_clipped():
    ctrl = AdaptiveDepth(1, seed=0)
    for _ in range(5):
        ctrl.observe(cycle_stats(0, 0, 0.010))
    ctrl.observe(cycle_stats(0, 0, 5.0))  # e.g. a compile or a GC pause
    assert ctrl.costs()[0] < 0.015


def test_hysteresis_holds_a_nearly_as_good_depth():
    # depth 1 incumbent; depth 2 scores 2% better (1.75 / 0.01899 vs 1.5 / 0.0166)
    init = {"acceptance": [0.5, 0.5], "cost": {"0": 0.0166, "1": 0.0166, "2": 0.01899},
            "depth": 1}
    ctrl = AdaptiveDepth(2, explore=0.0, explore_min=0.0, initial=init)
    assert ctrl.warmup == 0
    s = ctrl.scores()
    assert 1.0 < s[2] / s[1] < 1.04
    assert ctrl.choose() == (1, "hold (hysteresis)")
    ctrl2 = AdaptiveDepth(2, explore=0.0, explore_min=0.0, margin=0.01, initial=init)
    assert ctrl2.choose() == (2, "switch")


def test_state_round_trips_into_a_new_controller():
    ctrl = AdaptiveDepth(4, seed=1)
    simulate(ctrl, [(HIGH, 0.02, 0.003, 200)], seed=1)
    state = ctrl.state()
    again = AdaptiveDepth(4, seed=2, explore=0.0, explore_min=0.0, initial=state)
    assert again.warmup == 0
    assert again.choose()[0] == state["depth"]
    phase = [(HIGH, 0.02, 0.003, 1)]  # depth 4 is best, depth 3 within 3 % of it
    assert fixed_rate(phase, state["depth"]) >= 0.97 * fixed_rate(phase, 4)
    assert again.acceptance() == pytest.approx(state["acceptance"], abs=1e-3)


def test_no_draft_head_means_depth_zero():
    ctrl = AdaptiveDepth(0)
    assert ctrl.choose() == (0, "no draft head")
    ctrl.observe(cycle_stats(0, 0, 0.01))
    assert ctrl.choose()[0] == 0


def test_invalid_arguments():
    with pytest.raises(ValueError):
        AdaptiveDepth(-1)
    with pytest.raises(ValueError):
        AdaptiveDepth(2, explore=0.01, explore_min=0.5)


def test_carry_over_keeps_one_controller_per_owner():
    from engine.depth.controller import carry_over

    first = carry_over(None, 3)
    simulate(first, [(HIGH, 0.02, 0.003, 50)], seed=0)
    again = carry_over(first, 3)
    assert again is first and again.epsilon() == again.explore  # a new request restarts exploring
    assert again.choose()[1] != "warmup"
    assert carry_over(first, 2) is not first  # a different head depth: a new controller
    seeded = carry_over(None, 3, initial={"acceptance": [0.9], "cost": {"0": 0.02, "3": 0.03}})
    assert seeded.warmup == 0
    assert "tok/s" in seeded.estimates_line()


def test_the_carryover_holds_the_depth_controller_and_prompt_cache(tiny_model):
    """The engine core's carryover owns both (the model holds neither); a reply at depth
    "auto" keeps its controller there, for the next reply."""
    from engine.decoding.session import PromptCache

    carry = carryover_of(tiny_model)
    assert isinstance(carry.prompt_cache, PromptCache)
    list(tiny_model.generate([5, 6, 7], max_tokens=6, depth="auto"))
    ctrl = carry.controllers[1]
    assert isinstance(ctrl, AdaptiveDepth)
    list(tiny_model.generate([5, 6, 7], max_tokens=6, depth="auto"))
    assert carry.controllers[1] is ctrl
    for name in ("prompt_cache", "disk_cache", "depth_controller", "batch_controllers"):
        assert not hasattr(tiny_model, name)


def test_costs_stay_positive_when_the_line_would_cross_zero():
    """Timed only at depths 3 and 4 with a steep slope, a straight line crosses zero before
    depth 0; its cost must not come out as ~0 (depth 0 would score without bound) nor
    poison the cost level for the other depths."""
    ctrl = AdaptiveDepth(4, seed=0, warmup=0)
    for _ in range(5):
        ctrl.observe(cycle_stats(3, 0, 0.010))
        ctrl.observe(cycle_stats(4, 0, 0.030))
    costs = ctrl.costs()
    assert costs[3] == pytest.approx(0.010, rel=0.05) and costs[4] == pytest.approx(0.030, rel=0.05)
    assert all(0.004 <= c <= 0.031 for c in costs), costs
    ctrl.observe(cycle_stats(0, 0, 0.008))  # depth 0 timed for the first time
    assert ctrl.costs()[3] == pytest.approx(0.010, rel=0.1), ctrl.costs()


def _reply(ctrl, cycles) -> list[tuple[bool, list[float]]]:
    """Feed one reply's cycles [(depth, accepted)]; returns (in the opening, acceptance)
    as the controller saw them before each cycle."""
    seen = []
    for d, accepted in cycles:
        seen.append((ctrl._acc.in_opening, ctrl.acceptance()))
        ctrl.observe(cycle_stats(d, accepted, 0.01 + 0.002 * d))
    ctrl.new_request()
    return seen


def test_hard_openings_are_learnt_apart_from_the_reply_body():
    # the demo's out-of-domain replies at T 0.7: the cycles after the first accept ~1 of 4,
    # from the 8th token on ~3.3; judged as the reply's own evidence, that hard start sent the
    # controller shallow for the rest of the reply
    hard_open = [(4, 4), (4, 0), (4, 1)] + [(4, 4)] * 12  # tokens 0-4, 5, 6-7, then the body
    ctrl = AdaptiveDepth(4, seed=0, explore=0.0, explore_min=0.0)
    for _ in range(12):
        seen = _reply(ctrl, hard_open)
    assert [o for o, _ in seen[:4]] == [True, True, True, False]
    opening, body = seen[2][1], seen[3][1]
    assert opening[1] < 0.7  # what openings do: the second draft is usually rejected
    assert min(body) > 0.9  # the body, right after this reply's hard opening: not lowered
    assert ctrl.choose()[0] == 4


def test_an_opening_worse_than_usual_lowers_the_body():
    ctrl = AdaptiveDepth(4, seed=0, explore=0.0, explore_min=0.0)
    for _ in range(12):
        _reply(ctrl, [(4, 3)] * 12)
    usual = _reply(ctrl, [(4, 3)] * 3)[-1][1]  # an opening like the others...
    worse = _reply(ctrl, [(2, 0)] * 8 + [(4, 3)])[-1][1]  # ...and one that rejects everything
    assert worse[0] < usual[0] - 0.1


def test_a_batch_row_brings_its_own_reply_position():
    # a batch's rows share one controller: each row's cycle says where its reply is
    ctrl = AdaptiveDepth(4, seed=0, explore=0.0, explore_min=0.0)
    for _ in range(30):
        ctrl.observe(cycle_stats(4, 4, 0.02), timed=False, position=50)
        ctrl.observe(cycle_stats(4, 0, 0.02), timed=False, position=2)  # a new row's opening
    assert not ctrl._acc.in_opening
    assert min(ctrl.acceptance()) > 0.9  # the openings did not lower the body
    assert ctrl._acc.opening_base(ctrl._acc.base())[0] < 0.2


def _reply_continuing(ctrl, cycles, *, continues: bool) -> list[float]:
    """Start a reply (``new_request(continues=...)``) and feed its cycles; returns the
    acceptance the controller expected before its first cycle."""
    ctrl.new_request(continues=continues)
    first = ctrl.acceptance()
    for d, accepted in cycles:
        ctrl.observe(cycle_stats(d, accepted, 0.01 + 0.002 * d))
    return first


def test_a_conversations_next_reply_starts_from_the_last_ones_acceptance():
    # an agent session after chats the head drafts well: each turn's reply rejects nearly
    # every draft. A reply of the same conversation starts from the last one's evidence; a
    # new conversation's reply starts from the long run again
    agent = [(1, 0)] * 20 + [(1, 1)] * 2
    results = {}
    for continues in (False, True):
        ctrl = AdaptiveDepth(4, seed=0, explore=0.0, explore_min=0.0)
        for _ in range(10):
            _reply_continuing(ctrl, [(4, 4)] * 20, continues=False)
        _reply_continuing(ctrl, agent, continues=False)
        results[continues] = _reply_continuing(ctrl, [], continues=continues)[0]
        if continues:
            assert ctrl.choose()[0] == 0  # the second turn opens at depth 0
            fresh = _reply_continuing(ctrl, [], continues=False)[0]
    assert results[True] < 0.45 < results[False]
    assert fresh == pytest.approx(results[False])  # nothing of it stays in a new conversation


def test_what_a_conversation_carries_is_a_few_observations():
    # however long the last reply, it weighs as ``CARRIED`` observations: the new reply's own
    # evidence soon outweighs it
    from engine.depth import controller

    ctrl = AdaptiveDepth(4, seed=0, explore=0.0, explore_min=0.0)
    _reply_continuing(ctrl, [(1, 0)] * 200, continues=False)
    ctrl.new_request(continues=True)
    assert ctrl._acc.reply[0].weight == pytest.approx(controller.CARRIED)
    for _ in range(12):
        ctrl.observe(cycle_stats(1, 1, 0.012))
    assert ctrl.acceptance()[0] > 0.6
