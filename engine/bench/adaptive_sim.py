"""A deterministic simulator for ``depth="auto"``: the real ``AdaptiveDepth`` controller on a
synthetic workload, against every fixed depth on the same replies.

The workload (``Workload``): replies of a prompt class, each with its own conditional
acceptance table by draft position (its class's table shifted by a uniform draw in
``±spread``: some prompts suit the head better than others) and its own length (a uniform
draw in ``lengths``, cut at ``max_tokens``; the first token comes with the prefill, as in
``engine.decoding``). A cycle at depth d (clipped to the token budget left, as the decode loop
clips it) accepts drafts position by position while a uniform draw falls below the table; it
costs ``cost[d]``. What the controller is told differs from that cost as a real clock does:
``±noise`` per cycle, a share ``spikes`` of cycles 2-4x slower (GC pauses), other load that
every ~60 cycles slows everything by up to ``load``, and ``compiles``: a controller's first
cycle, and its first at each depth, compile graphs and seem much slower. The ``"mixed"`` class
alternates the classes reply by reply, like ``bench --mixed``.

What it measures: tokens per second over all replies. Each cycle is credited with the tokens
it is expected to produce at its depth (up to the reply's end: drafts past it are wasted) and
with the mean cost of that depth, while the controller sees the sampled outcome and the noisy
time; so fixed depths hardly vary from run to run, and a difference of 1 % between auto and a
fixed depth is the controller's doing, not sampling noise.

How a controller starts (``controller``): ``cold`` (no saved tuning), ``seeded`` (what
``engine.depth.tuner`` would have saved: ``tuned_initial``) or ``carried`` (the model's controller
after as many replies of the *other* class, which is what a bench's later classes meet).

Everything depends only on the seeds: the same call gives the same numbers.
"""
from __future__ import annotations

import bisect
import functools
import itertools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.depth.controller import AdaptiveDepth
from engine.types import CycleStats

DEMO_COST = (1.0, 1.47, 1.88, 2.27, 2.66)  # the demo model's cycle / plain step (engine tune)


@dataclass(frozen=True)
class Workload:
    """Conditional acceptance tables by class, and the cycle cost by depth 0..D."""

    name: str
    classes: dict[str, tuple[float, ...]]
    cost: tuple[float, ...] = DEMO_COST
    noise: float = 0.15  # cycle time ± this share (uniform), seen by the controller only
    spikes: float = 0.03  # this share of cycles seems 2-4x slower to it (GC pauses)
    load: float = 0.25  # other load: every ~60 cycles everything runs up to this much slower
    # compiles: a controller's first cycle seems this much slower (the process compiles the
    # model's graphs: 17.5 s against 20 ms measured on the demo after loading), its first
    # cycle at each other depth this much (that depth's verify shapes: 1.6-1.7x)
    compiles: tuple[float, float] = (200.0, 1.7)
    # depth 0 is pipelined (``engine.decoding.plain``): the step before a drafting cycle only
    # reads what was queued (its cost x ``restart[0]``), the one after it builds two steps
    # (x ``restart[1]``), and a drafting cycle right after depth 0 costs x ``restart[2]`` (it
    # is not overlapped, and the head first catches up on the plain steps' pairs);
    # (1, 1, 1): not modelled
    restart: tuple[float, float, float] = (1.0, 1.0, 1.0)
    spread: float = 0.08  # each reply's table: the class's ± this (uniform, all positions)
    lengths: tuple[int, int] = (24, 110)  # a reply's tokens (to its end of sequence), uniform
    # recorded replies by class (``engine.bench.adaptive_traces``): (accepted drafts of each cycle
    # at the deepest depth, the reply's tokens); when given, replies are drawn from these
    recorded: dict = field(default_factory=dict)

    @property
    def max_depth(self) -> int:
        return len(self.cost) - 1


# Tables that resemble the demo model at temperature 0 and 0.7 (README's bench), and rougher
# ones (a head that is often wrong out of its domain), as the issue describes them.
WORKLOADS = (
    Workload("demo-T0", {"in-domain": (0.99, 0.91, 0.89, 0.83),
                         "out-of-domain": (0.95, 0.82, 0.81, 0.78)}),
    Workload("demo-T0.7", {"in-domain": (0.98, 0.91, 0.90, 0.85),
                           "out-of-domain": (0.92, 0.87, 0.85, 0.70)}),
    Workload("rough-T0", {"in-domain": (0.90, 0.85, 0.80, 0.75),
                          "out-of-domain": (0.50, 0.35, 0.30, 0.25)}),
    Workload("rough-T0.7", {"in-domain": (0.80, 0.72, 0.66, 0.60),
                            "out-of-domain": (0.42, 0.30, 0.25, 0.20)}),
    Workload("cheap-verify-T0", {"in-domain": (0.90, 0.85, 0.80, 0.75),
                                 "out-of-domain": (0.50, 0.35, 0.30, 0.25)},
             cost=(1.0, 1.12, 1.22, 1.32, 1.42)),
    Workload("dear-verify-T0.7", {"in-domain": (0.80, 0.72, 0.66, 0.60),
                                  "out-of-domain": (0.42, 0.30, 0.25, 0.20)},
             cost=(1.0, 1.7, 2.3, 2.9, 3.5)),
)


# An agent session on the demo (``engine.bench.agent_session``): after chats the head drafts
# well, one conversation's short replies (32 tokens) to tool results it drafts poorly, and
# depth 0 pipelined as the decoder runs it (the plain step before a drafting cycle only reads,
# ~0.5 against ~5.5 ms; the one after it builds two steps, ~11 ms; a depth-1 probe from depth 0
# ~10-14 ms against 6-8 for a depth-1 cycle among others: measured in process).
AGENT = Workload("agent-T0", {"in-domain": (0.99, 0.91, 0.89, 0.83),
                              "agent": (0.3, 0.6, 0.6, 0.5)},
                 lengths=(32, 32), restart=(0.1, 2.0, 1.6))


@dataclass(frozen=True)
class Reply:
    """One simulated reply."""

    acceptance: tuple[float, ...]  # conditional acceptance by draft position
    length: int  # tokens up to and with its end of sequence
    trace: tuple[int, ...] = ()  # recorded: drafts each cycle accepted at the deepest depth

    def draw(self, pos: int, d: int, rng: random.Random) -> int:
        """Drafts a cycle at depth ``d`` starting ``pos`` tokens after the reply's first
        accepts: from the recording, else position by position from the table."""
        if self.trace:
            return min(self.recorded_at(pos), d)
        accepted = 0
        while accepted < d and rng.random() < self.acceptance[accepted]:
            accepted += 1
        return accepted

    def recorded_at(self, pos: int) -> int:
        """The recorded cycle's accepted drafts for a cycle that starts ``pos`` tokens after
        the reply's first: the one recorded from the latest start at or before ``pos``."""
        j = bisect.bisect_right(self._starts, pos) - 1
        return self.trace[max(j, 0)]

    @functools.cached_property
    def _starts(self) -> list[int]:
        return list(itertools.accumulate((a + 1 for a in self.trace[:-1]), initial=0))


CLASSES = ("in-domain", "out-of-domain", "mixed")
STARTS = ("cold", "seeded", "carried")


def replies_for(w: Workload, cls: str, n: int, rng: random.Random) -> list[Reply]:
    """``n`` replies of class ``cls``; ``"mixed"`` alternates the classes reply by reply. A
    recorded workload draws each reply from its class's recordings."""
    names = list(w.classes) if cls == "mixed" else [cls]
    out = []
    for r in range(n):
        base = w.classes[names[r % len(names)]]
        if w.recorded:
            trace, length = rng.choice(w.recorded[names[r % len(names)]])
            out.append(Reply(base, length, tuple(trace)))
            continue
        shift = w.spread * (2 * rng.random() - 1)
        table = tuple(min(max(p + shift, 0.0), 0.995) for p in base)
        out.append(Reply(table, rng.randint(*w.lengths)))
    return out


def expected_tokens(p, d: int) -> float:
    """Expected tokens of a cycle at depth d: 1 + a1 + a1·a2 + … + a1·…·ad."""
    e = run = 1.0
    for a in p[:d]:
        run *= a
        e += run
    return e


class Fixed:
    """The decoder at one fixed depth, in the controller's interface."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def choose(self) -> tuple[int, str]:
        return self.depth, "fixed"

    def observe(self, stats: CycleStats) -> None:
        pass

    def new_request(self, continues: bool = False) -> None:
        pass


@dataclass
class Outcome:
    tokens: float = 0.0  # expected tokens of the cycles run
    seconds: float = 0.0  # their mean costs
    depths: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)  # cycles by the controller's reason
    by_reason: dict = field(default_factory=dict)  # reason: [expected tokens, seconds]

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _stats(d: int, accepted: int, t: float) -> CycleStats:
    drafted = tuple(range(10, 10 + d))
    kind = "plain" if d == 0 else ("bonus" if accepted == d else "correction")
    return CycleStats(index=0, depth=d, drafted=drafted, accepted=accepted,
                      emitted=drafted[:accepted] + (1,), from_draft=(True,) * accepted + (False,),
                      extra_kind=kind, t_total=t)


def run_replies(ctrl, replies: list[Reply], w: Workload, *, max_tokens: int = 128,
                seed: int = 0, out: Outcome | None = None,
                compiled: set | None = None, conversation: bool = False) -> Outcome:
    """Decode ``replies`` with ``ctrl``, calling ``new_request()`` between them. A cycle's
    depth is clipped to the token budget left, as ``engine.decoding`` clips it; drafts past the
    end of sequence are wasted (its credit counts only the tokens up to it). A recorded
    reply's cycle at depth d accepts ``min(a, d)`` drafts, ``a`` what the recorded cycle that
    started at the same place in the reply (or just before) accepted at the deepest depth,
    and is credited with its tokens. ``compiled``: the depths this controller has run before
    (their graphs are compiled); updated. ``conversation``: each reply continues the one
    before (``new_request(continues=True)``: an agent session's turns)."""
    rng = random.Random(seed)
    compiled = set() if compiled is None else compiled
    out = out or Outcome()
    slow = 1.0
    prev, prev_tally = 0, None  # the cycle before: its depth and its reason's tally
    for i, reply in enumerate(replies):
        if i:
            ctrl.new_request(continues=conversation)
        p = reply.acceptance
        left = min(reply.length, max_tokens) - 1  # the first token came with the prefill
        budget = max_tokens - 1
        while left > 0:
            d, reason = ctrl.choose()
            d = max(0, min(int(d), budget - 1, w.max_depth))
            accepted = reply.draw(max_tokens - 1 - budget, d, rng)
            if rng.random() < 1 / 60:
                slow = 1 + w.load * rng.random()
            cost = w.cost[d] * (w.restart[1] if d == 0 and prev > 0 else
                                w.restart[2] if d > 0 and prev == 0 else 1.0)
            if prev == 0 and d > 0 and prev_tally is not None:  # the step before only read
                read_only = w.cost[0] * (1.0 - w.restart[0])   # its token
                out.seconds -= read_only
                prev_tally[1] -= read_only
            prev = d
            t = slow * cost * (1 + w.noise * (2 * rng.random() - 1))
            if rng.random() < w.spikes:
                t *= 2 + 2 * rng.random()
            if d not in compiled:
                t *= w.compiles[1 if compiled else 0]
                compiled.add(d)
            ctrl.observe(_stats(d, accepted, t))
            gain = min(accepted + 1, left) if reply.trace else \
                expected_tokens(p, min(d, left - 1))
            out.tokens += gain
            out.seconds += cost
            out.depths[d] += 1
            out.reasons[reason] += 1
            tally = prev_tally = out.by_reason.setdefault(reason, [0.0, 0.0])
            tally[0] += gain
            tally[1] += cost
            left -= accepted + 1
            budget -= accepted + 1
    return out


def tuned_initial(w: Workload) -> dict | None:
    """What ``engine.depth.tuner`` would save for this workload: its prompts are mostly in-domain
    (6 of 8), acceptance from the deepest depth, costs per depth (measured within 5 %), the
    winning depth; None when nothing beats plain decoding (then nothing is saved)."""
    names = list(w.classes)
    weights = [0.75, 0.25] if len(names) == 2 else [1 / len(names)] * len(names)
    blend = tuple(sum(wt * w.classes[n][i] for wt, n in zip(weights, names))
                  for i in range(w.max_depth))
    rates = [expected_tokens(blend, d) / w.cost[d] for d in range(w.max_depth + 1)]
    best = max(range(len(rates)), key=rates.__getitem__)
    if best == 0 or rates[best] < 1.03 * rates[0]:
        return None
    err = random.Random(w.name)
    return {"acceptance": [round(a, 3) for a in blend],
            "cost": {str(d): c * (1 + 0.05 * (2 * err.random() - 1))
                     for d, c in enumerate(w.cost)},
            "depth": best}


def controller(w: Workload, start: str, seed: int,
               factory: Callable[..., AdaptiveDepth] = AdaptiveDepth):
    """A new controller for ``start`` (see the module docstring; ``compare`` runs the replies
    that make a ``carried`` one)."""
    if start == "cold":
        return factory(w.max_depth, seed=seed)
    if start == "seeded":
        return factory(w.max_depth, seed=seed, initial=tuned_initial(w))
    if start == "carried":
        return factory(w.max_depth, seed=seed)
    raise ValueError(f"unknown start {start!r}")


def _other(w: Workload, cls: str) -> str:
    """The class a ``carried`` controller saw before ``cls`` (the first one before "mixed")."""
    names = list(w.classes)
    return names[1] if cls == names[0] else names[0]


def compare(w: Workload, cls: str, *, start: str = "cold", runs: int = 4, replies: int = 20,
            max_tokens: int = 128, seed: int = 0,
            factory: Callable[..., AdaptiveDepth] = AdaptiveDepth,
            conversation: bool = False) -> dict:
    """Tokens/s of auto and of every fixed depth on ``replies`` replies of class ``cls``, summed
    over ``runs`` runs (each with its own replies and seeds); ``ratio`` = auto / the best fixed
    depth; ``lost``: what auto's cycles cost against that depth, by the controller's reason,
    in seconds of auto's ``seconds``. ``conversation``: the replies of ``cls`` are one
    conversation's turns (a ``carried`` controller's earlier replies are another's)."""
    auto = Outcome()
    fixed = {d: Outcome() for d in range(w.max_depth + 1)}
    for r in range(runs):
        s = seed + 1000 * r
        tables = replies_for(w, cls, replies, random.Random(s))
        ctrl, compiled = controller(w, start, s, factory), set()
        if start == "carried":
            before = replies_for(w, _other(w, cls), replies, random.Random(s + 1))
            run_replies(ctrl, before, w, max_tokens=max_tokens, seed=s + 2, compiled=compiled)
            ctrl.new_request()
        run_replies(ctrl, tables, w, max_tokens=max_tokens, seed=s + 3, out=auto,
                    compiled=compiled, conversation=conversation)
        for d, o in fixed.items():
            run_replies(Fixed(d), tables, w, max_tokens=max_tokens, seed=s + 3, out=o)
    rates = {d: o.rate for d, o in fixed.items()}
    best = max(rates, key=rates.__getitem__)
    lost = {why: sec - tok / rates[best] for why, (tok, sec) in auto.by_reason.items()}
    return {"auto": auto.rate, "fixed": rates, "best": best, "ratio": auto.rate / rates[best],
            "depths": auto.depths, "reasons": auto.reasons, "lost": lost,
            "seconds": auto.seconds}


def table(workloads=WORKLOADS, starts=STARTS, **kw) -> list[dict]:
    """One row per (workload, start, class): auto / best fixed depth, and which depth that was."""
    return [{"workload": w.name, "start": s, "class": c, **compare(w, c, start=s, **kw)}
            for w in workloads for s in starts for c in CLASSES]


def format_table(rows: list[dict]) -> str:
    """``table()`` as text: auto / best fixed depth, every fixed depth / the best, and the
    share of auto's time each kind of decision lost against the best."""
    lines = [f"{'workload':<18} {'start':<8} {'class':<14} {'auto/best':>9} {'best':>4}  "
             "fixed depths 0..D / best  share of auto's time lost, by reason"]
    for r in rows:
        best = r["fixed"][r["best"]]
        rel = " ".join(f"{v / best:.2f}" for v in r["fixed"].values())
        lines.append(f"{r['workload']:<18} {r['start']:<8} {r['class']:<14} "
                     f"{r['ratio']:>9.3f} {r['best']:>4}  {rel}  " + " ".join(
                         f"{why}:{x / r['seconds']:+.3f}" for why, x in sorted(r["lost"].items())))
    return "\n".join(lines)
