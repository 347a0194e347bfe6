"""Online choice of the draft depth (``depth="auto"``): maximise expected tokens per second.

Before each cycle the decode loop asks ``choose()`` for a depth; after it, it hands the cycle's
``CycleStats`` to ``observe()``. The controller keeps

- a_i, the acceptance of draft position i *given that position i was reached* (all earlier
  drafts accepted), as a discounted mean: each observation weighs 1, older ones fade with a
  half-life of ``half_life`` observations, and a weak prior (strength ``PRIOR_WEIGHT``) pulls
  rarely-seen positions toward the one before them. Positions that go unobserved slowly
  relax toward that prior (``idle_half_life`` cycles), so a depth abandoned in a bad stretch
  gets retried once the evidence against it is old;
- t(d), the measured cycle time at depth d (``CycleStats.t_total``, discounted mean with
  ``cost_half_life``, outliers clipped at ``3x``); depths measured fewer than twice come from a
  weighted least-squares line t(d) = c0 + c1·d through the measured ones.

score(d) = (1 + a1 + a1·a2 + … + a1·…·ad) / t(d) is the expected tokens per second; depth 0
scores 1/t(0). After ``warmup`` cycles (a fixed schedule that visits every depth), the
controller keeps an incumbent depth and switches only when another depth scores more than
``margin`` better (hysteresis). At a rate epsilon (``explore``, decaying toward ``explore_min``;
at least ``ZERO_EXPLORE`` while the incumbent is depth 0, where nothing else is learnt about
acceptance) it probes a neighbour of the incumbent for one cycle; probes are evenly spaced.
A fast mean per position watches for shifts: when it strays ``SHIFT_GAP`` from the slow one,
that position restarts from recent evidence and deeper positions fall back to their priors.

Exactness: the depth depends only on past cycles and the controller's own ``random.Random``
(seeded), never on the sampler's random state, so every depth sequence decodes exactly.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from engine.types import CycleStats

PRIOR_WEIGHT = 1.0  # pseudo-observations behind each acceptance prior
PRIOR_DECAY = 0.9  # prior for position i+1 = PRIOR_DECAY * a_i
COST_SLOPE_PRIOR = 0.15  # c1 / c0 assumed while only one depth has been timed
SHIFT_HALF_LIFE = 3.0  # a fast mean per position watches for a shift in acceptance...
SHIFT_GAP = 0.35  # ...and when it strays this far from the slow one, the slow one restarts
ZERO_EXPLORE = 0.1  # at depth 0 nothing is learnt about acceptance except by probing
OUTLIER = 3.0  # cycle times above OUTLIER x the estimate are clipped (compiles, GC, ...)


def _decay(half_life: float) -> float:
    return 0.5 ** (1.0 / half_life) if half_life > 0 else 0.0


@dataclass
class _Discounted:
    """Discounted sum of observations and of their weights."""

    total: float = 0.0
    weight: float = 0.0

    def add(self, x: float, gamma: float) -> None:
        self.total = gamma * self.total + x
        self.weight = gamma * self.weight + 1.0

    def fade(self, gamma: float) -> None:
        self.total *= gamma
        self.weight *= gamma

    @property
    def mean(self) -> float:
        return self.total / self.weight if self.weight > 0 else 0.0


class AdaptiveDepth:
    """Chooses a depth in ``0..max_depth`` for each cycle; see the module docstring.

    ``initial`` (e.g. a previous controller's ``state()``, or numbers from the tuner) may hold
    ``"acceptance"``: conditional per-position rates, used as the positions' priors,
    ``"cost"``: {depth: seconds} (each worth two observations) and ``"depth"``: the incumbent;
    when it gives costs for two or more depths the warm-up is skipped unless ``warmup`` is
    given. One controller may be reused across requests; call ``new_request()`` between them
    so fresh evidence counts more.
    """

    def __init__(self, max_depth: int, *, warmup: int | None = None, explore: float = 0.08,
                 explore_min: float = 0.02, explore_decay: float = 100.0, margin: float = 0.04,
                 half_life: float = 12.0, idle_half_life: float = 64.0,
                 cost_half_life: float = 24.0, prior: float = 0.6, seed: int = 0,
                 initial: dict | None = None) -> None:
        if max_depth < 0:
            raise ValueError("max_depth must be >= 0")
        if not 0.0 <= explore_min <= explore <= 1.0:
            raise ValueError("need 0 <= explore_min <= explore <= 1")
        self.max_depth = max_depth
        self.explore, self.explore_min, self.explore_decay = explore, explore_min, explore_decay
        self.margin = margin
        self._gamma = _decay(half_life)
        self._idle = _decay(idle_half_life)
        self._cost_gamma = _decay(cost_half_life)
        self._prior = prior
        self._rng = random.Random(seed)
        self._credit = self._rng.random()  # exploration "credit"; a random phase per seed
        self._acc = [_Discounted() for _ in range(max_depth)]
        self._fast = [_Discounted() for _ in range(max_depth)]
        self._fast_gamma = _decay(SHIFT_HALF_LIFE)
        self.shifts = 0  # how often a shift in acceptance was detected
        self._priors: list[float | None] = [None] * max_depth
        self._cost = [_Discounted() for _ in range(max_depth + 1)]
        self._cycles = 0  # observed cycles
        self._since_request = 0
        self._incumbent: int | None = None
        seeded = self._load(initial or {})
        if warmup is None:
            warmup = 0 if seeded else 2 * (max_depth + 1)  # every depth twice
        self.warmup = warmup if max_depth > 0 else 0
        self._schedule = [max_depth] + list(range(max_depth))  # D, 0, 1, ..., D-1

    # -- estimates -------------------------------------------------------------------------
    def acceptance(self) -> list[float]:
        """Conditional acceptance a_1..a_D: the discounted mean shrunk toward its prior
        (the ``initial`` value for that position, else ``PRIOR_DECAY`` x the position before)."""
        out, prior = [], self._prior
        for acc, fixed in zip(self._acc, self._priors):
            prior = prior if fixed is None else fixed
            a = (acc.total + PRIOR_WEIGHT * prior) / (acc.weight + PRIOR_WEIGHT)
            out.append(a)
            prior = PRIOR_DECAY * a
        return out

    def costs(self) -> list[float]:
        """Estimated cycle seconds t(0)..t(D) (0.0 for all when nothing was timed yet)."""
        seen = [(d, c.mean, min(c.weight, 10.0)) for d, c in enumerate(self._cost) if c.weight > 0]
        if not seen:
            return [0.0] * (self.max_depth + 1)
        c0, c1 = self._fit(seen)
        return [c.mean if c.weight >= 1.5 else max(c0 + c1 * d, 1e-9)
                for d, c in enumerate(self._cost)]

    @staticmethod
    def _fit(seen: list[tuple[int, float, float]]) -> tuple[float, float]:
        """Weighted least squares t = c0 + c1·d; slope >= 0; a prior slope for one depth."""
        sw = sum(w for _, _, w in seen)
        md = sum(w * d for d, _, w in seen) / sw
        mt = sum(w * t for _, t, w in seen) / sw
        var = sum(w * (d - md) ** 2 for d, _, w in seen)
        if var <= 0:
            c0 = mt / (1 + COST_SLOPE_PRIOR * md)
            return c0, COST_SLOPE_PRIOR * c0
        c1 = max(0.0, sum(w * (d - md) * (t - mt) for d, t, w in seen) / var)
        return mt - c1 * md, c1

    def scores(self) -> list[float]:
        """Expected tokens per second for each depth 0..D."""
        a, t = self.acceptance(), self.costs()
        out, expected, run = [], 1.0, 1.0
        for d in range(self.max_depth + 1):
            if d > 0:
                run *= a[d - 1]
                expected += run
            out.append(expected / t[d] if t[d] > 0 else 0.0)
        return out

    def epsilon(self) -> float:
        eps = max(self.explore_min, self.explore / (1.0 + self._since_request / self.explore_decay))
        return max(eps, ZERO_EXPLORE) if self._incumbent == 0 and self.explore > 0 else eps

    # -- decisions -------------------------------------------------------------------------
    def choose(self) -> tuple[int, str]:
        """The depth for the next cycle and a short reason."""
        if self.max_depth == 0:
            return 0, "no draft head"
        if self._cycles < self.warmup:
            return self._schedule[self._cycles % len(self._schedule)], "warmup"
        scores = self.scores()
        best = max(range(len(scores)), key=lambda d: (scores[d], -d))  # ties -> lower depth
        reason = "best score"
        if self._incumbent is None:
            self._incumbent = best
        elif best != self._incumbent:
            if scores[best] > scores[self._incumbent] * (1.0 + self.margin):
                self._incumbent, reason = best, "switch"
            else:
                reason = "hold (hysteresis)"
        self._credit += self.epsilon()  # probes at rate epsilon, evenly spaced
        if self._credit >= 1.0:
            self._credit -= 1.0
            return self._neighbour(self._incumbent), "explore"
        return self._incumbent, reason

    def _neighbour(self, d: int) -> int:
        if d == 0:
            return 1
        if d == self.max_depth:
            return d - 1
        return d + (1 if self._rng.random() < 0.5 else -1)

    def observe(self, stats: CycleStats) -> None:
        """Learn from a finished cycle (its drafted length, accepted count and time)."""
        k = min(len(stats.drafted), self.max_depth)
        reached = min(stats.accepted + 1, k)  # positions 1..reached were judged
        for i, (acc, fast) in enumerate(zip(self._acc, self._fast)):
            if i >= reached:
                acc.fade(self._idle)
                continue
            x = 1.0 if i < stats.accepted else 0.0
            acc.add(x, self._gamma)
            fast.add(x, self._fast_gamma)
            if fast.weight >= 3.0 and abs(fast.mean - acc.mean) > SHIFT_GAP:
                self._on_shift(i)
        if stats.t_total > 0 and math.isfinite(stats.t_total):
            cost = self._cost[k]
            t = stats.t_total
            if cost.weight >= 2:
                t = min(t, OUTLIER * cost.mean)
            cost.add(t, self._cost_gamma)
        self._cycles += 1
        self._since_request += 1

    def _on_shift(self, i: int) -> None:
        """Acceptance at position i+1 moved: restart it from recent evidence, and let the
        deeper positions (whose evidence is just as old) fall back to their priors."""
        self._acc[i].total, self._acc[i].weight = self._fast[i].total, self._fast[i].weight
        for acc in self._acc[i + 1:]:
            acc.fade(0.1)
        self.shifts += 1

    def new_request(self) -> None:
        """A new prompt starts: old acceptance evidence counts less, exploration restarts."""
        for acc in self._acc:
            acc.fade(0.25)
        self._since_request = 0

    # -- persistence -----------------------------------------------------------------------
    def state(self) -> dict:
        """Plain numbers that ``initial=`` accepts (JSON-serialisable)."""
        return {
            "acceptance": [round(a, 4) for a in self.acceptance()],
            "cost": {str(d): c.mean for d, c in enumerate(self._cost) if c.weight > 0},
            "depth": self._incumbent,
        }

    def _load(self, initial: dict) -> bool:
        for i, a in enumerate(list(initial.get("acceptance") or [])[: self.max_depth]):
            self._priors[i] = min(max(float(a), 0.0), 1.0)
        costs = {int(d): float(t) for d, t in (initial.get("cost") or {}).items()
                 if 0 <= int(d) <= self.max_depth and float(t) > 0}
        for d, t in costs.items():
            self._cost[d].total, self._cost[d].weight = 2.0 * t, 2.0
        depth = initial.get("depth")
        if isinstance(depth, int) and 0 <= depth <= self.max_depth:
            self._incumbent = depth
        return len(costs) >= 2

    def estimates_line(self) -> str:
        """One line for logs: acceptance, costs (ms) and scores by depth."""
        e = self.estimates()
        acc = " ".join(f"{a:.2f}" for a in e["acceptance"])
        cost = " ".join(f"{1000 * t:.1f}" for t in e["cost"])
        score = " ".join(f"{x:.0f}" for x in e["score"])
        return f"depth {e['depth']} | a: {acc} | ms: {cost} | tok/s: {score}"

    def estimates(self) -> dict:
        """What the controller currently believes (for logs and the dashboard)."""
        return {"acceptance": self.acceptance(), "cost": self.costs(), "score": self.scores(),
                "depth": self._incumbent, "epsilon": self.epsilon(), "cycles": self._cycles}


def carry_over(current: AdaptiveDepth | None, max_depth: int, *,
               initial: dict | None = None) -> AdaptiveDepth:
    """The controller for the next reply: ``current`` again when it fits ``max_depth`` (what
    it learnt carries over, so the warm-up runs once per model; a new request starts:
    ``new_request()``), else a new one seeded with ``initial`` (e.g. the tuner's
    ``adaptive_initial``). The owner (``Model.depth_controller``) keeps the result."""
    if current is None or current.max_depth != max_depth:
        return AdaptiveDepth(max_depth, initial=initial)
    current.new_request()
    return current
