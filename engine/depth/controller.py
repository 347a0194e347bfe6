"""Online choice of the draft depth (``depth="auto"``): maximise expected tokens per second.

Before each cycle the decode loop asks ``choose()`` for a depth; after it, it hands the cycle's
``CycleStats`` to ``observe()``; ``new_request()`` marks the start of the next reply. The
controller keeps

- a_i, the acceptance of draft position i *given that position i was reached* (all earlier
  drafts accepted), in two layers. The *long-run* rate per position counts every reply
  (``long_half_life`` observations; a weak prior, strength ``PRIOR_WEIGHT``, pulls rarely seen
  positions toward the one before them, or toward ``initial``'s rates, ``SEED_WEIGHT``; a rate
  beyond position 1 that no cycle renews fades back toward that prior over ``LONG_IDLE`` x
  ``idle_half_life`` cycles, so what a deep position did in another kind of reply does not
  linger). The *reply's own* evidence (``half_life`` observations) starts afresh with each
  request, except that a request continuing the last reply's conversation (an agent's next
  turn: ``new_request(continues=True)``) keeps that reply's as at most ``CARRIED``
  observations a position, and its exploration goes on decaying; what a cycle did not renew
  fades (``idle_half_life`` cycles). A reply that suits the
  head better or worse than usual shifts every position alike, so the reply's evidence first
  fits one log-odds shift of the long-run rates (a Cauchy prior of scale ``SHIFT_SD``): what
  position 1 shows of an out-of-domain reply lowers positions 2..D before any is reached. Each
  position's estimate is then its own evidence in this reply plus ``REPLY_PRIOR``
  pseudo-observations of that shifted rate. A fast mean per position watches for a shift within
  a reply: when it strays ``SHIFT_Z`` standard errors from the reply's older evidence, that
  position restarts from the recent cycles and the deeper positions from the shifted long run.
  A reply's *opening* (its cycles that start before its ``OPENING``-th token) is learnt apart:
  the demo's out-of-domain replies at T 0.7 accept ~1 draft of 4 in the cycles after the
  first and ~3.3 from the 8th token on; taken as the reply's own evidence, that start sent the
  controller shallow for the rest of the reply. Openings have their own long-run rates (shrunk
  toward the body's, ``OPENING_PRIOR``), which the opening's cycles use; an opening counts
  toward the reply's shift only against them (worse than openings usually are), never as
  the body's own evidence;
- t(d), the cycle time at depth d, as a *level* times a *profile*: the level follows how fast
  the machine runs right now (``LEVEL_GAIN`` per cycle; other load slows every depth alike),
  the profile is what depth d costs relative to it (a mean over ``cost_half_life`` of its
  cycles). Residuals are clipped in log space (``CLIP``), so a GC pause moves little; three
  in a row beyond it on one side (``BREAK``) move the level at once (other load started). A
  depth's first cycle in a controller's life may compile graphs (17.5 s against 20 ms on the
  demo after loading): it is held back until the second, and the two count as two timings
  (their mean, or the faster when they differ by more than ``CLIP``). Depths timed fewer than
  twice come from a weighted least-squares line through the timed ones.

score(d) = (1 + a1 + a1·a2 + … + a1·…·ad) / t(d) is the expected tokens per second; depth 0
scores 1/t(0). After ``warmup`` cycles (a fixed schedule that visits every depth; none when
``initial`` gives costs), the controller keeps an incumbent depth and switches only when
another depth scores more than ``margin`` better (hysteresis; ``ZERO_MARGIN`` times that to or
from depth 0, where nothing is learnt about acceptance). Probes: at a rate epsilon
(``explore``, decaying toward ``explore_min`` within a reply; at least ``ZERO_EXPLORE`` while
the incumbent is depth 0), evenly spaced, it runs a neighbour of the incumbent for one cycle
(a depth two away when no neighbour qualifies), but only one that could still beat the
incumbent: its *optimistic* score (acceptance ``OPTIMISM`` standard errors higher by the
evidence behind it, cost as much lower by its timed cycles) must exceed the incumbent's score.
A depth that is clearly worse is not probed until its evidence has faded.

Exactness: the depth depends only on past cycles and the controller's own ``random.Random``
(seeded), never on the sampler's random state, so every depth sequence decodes exactly.
``engine.bench.adaptive_sim`` measures the controller against every fixed depth on synthetic work.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from engine.types import CycleStats

PRIOR_WEIGHT = 1.0  # pseudo-observations behind each long-run acceptance prior...
SEED_WEIGHT = 4.0  # ... and behind a rate that ``initial`` gives (the tuner measured it)
PRIOR_DECAY = 0.9  # prior for position i+1 = PRIOR_DECAY * a_i
LONG_IDLE = 3.0  # long-run rates beyond position 1 not renewed fade: LONG_IDLE x idle_half_life
REPLY_PRIOR = 4.0  # pseudo-observations of the shifted long-run rate behind a reply's own
SHIFT_SD = 0.7  # prior scale (log-odds) of one reply's shift against the long run
COST_SLOPE_PRIOR = 0.15  # c1 / c0 assumed while only one depth has been timed
LEVEL_GAIN = 0.15  # share of a cycle's (clipped) surprise that moves the cost level
CLIP = 0.3  # cycle-time residuals are clipped to ± this in log space (GC pauses, ...)
FIRST_CLIP = 1.0  # ... and to ± this for a depth's first timing against the fitted line
BREAK = 3  # this many residuals in a row beyond CLIP, on one side, move the level at once
COST_SPREAD = 0.1  # relative spread of one cycle time, for the optimistic cost
OPTIMISM = 1.5  # standard errors: how much better a neighbour might be and still get probed
OPENING = 8  # a reply's cycles that start before its 8th token (after the first) are its opening
OPENING_PRIOR = 2.0  # pseudo-observations of the body's rate behind an opening rate
SHIFT_HALF_LIFE = 3.0  # a fast mean per position watches for a shift within a reply...
SHIFT_Z = 2.0  # ...and when it strays this many standard errors from the reply's, that restarts
ZERO_MARGIN = 2.0  # switching to or from depth 0 takes this x margin
ZERO_EXPLORE = 0.1  # at depth 0 nothing is learnt about acceptance except by probing
CARRIED = 4.0  # a conversation's last reply: at most this many observations a position carried
LINE_FLOOR = 0.4  # the fitted cost line at depth 0 is at least this x the cheapest timed cost


def _decay(half_life: float) -> float:
    return 0.5 ** (1.0 / half_life) if half_life > 0 else 0.0


def _logit(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _clip(x: float, bound: float) -> float:
    return min(max(x, -bound), bound)


def _shifted(fast: _Discounted, reply: _Discounted) -> bool:
    """Whether the recent rate (``fast``) is ``SHIFT_Z`` standard errors away from the rate
    of the reply's older evidence (``reply`` less roughly what ``fast`` holds)."""
    old_weight = reply.weight - fast.weight
    if old_weight < 2.0:
        return False
    old = (reply.total - fast.total) / old_weight
    m = min(max(reply.mean, 0.05), 0.95)
    se = math.sqrt(m * (1 - m) * (1 / fast.weight + 1 / old_weight))
    return abs(fast.mean - old) > SHIFT_Z * se


def _rates(acceptance: list[float], costs: list[float]) -> list[float]:
    """Expected tokens per second at each depth 0..D."""
    out, expected, run = [], 1.0, 1.0
    for d, t in enumerate(costs):
        if d > 0:
            run *= acceptance[d - 1]
            expected += run
        out.append(expected / t if t > 0 else 0.0)
    return out


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


class _Acceptance:
    """Conditional acceptance by position: long-run rates, the current reply's evidence and
    the log-odds shift between them (see the module docstring)."""

    def __init__(self, depth: int, *, prior: float, half_life: float, long_half_life: float,
                 idle_half_life: float) -> None:
        self.long = [_Discounted() for _ in range(depth)]
        self.reply = [_Discounted() for _ in range(depth)]
        self.fast = [_Discounted() for _ in range(depth)]
        self.opening = [_Discounted() for _ in range(depth)]  # long-run, openings only
        self.reply_open = [_Discounted() for _ in range(depth)]  # this reply's opening
        self.tokens = 0  # the reply's tokens so far (after its first)
        self.shifts = 0  # how often a shift within a reply was detected
        self.priors: list[float | None] = [None] * depth
        self.prior = prior
        self._gamma, self._long_gamma = _decay(half_life), _decay(long_half_life)
        self._idle, self._fast_gamma = _decay(idle_half_life), _decay(SHIFT_HALF_LIFE)
        self._long_idle = _decay(LONG_IDLE * idle_half_life) if LONG_IDLE > 0 else 1.0

    @property
    def in_opening(self) -> bool:
        return self.tokens < OPENING

    def observe(self, reached: int, accepted: int, position: int | None = None) -> None:
        """One cycle that judged ``reached`` positions and accepted ``accepted`` drafts,
        ``position`` tokens into its reply (after the first; None: this reply's count)."""
        opening = self.in_opening if position is None else position < OPENING
        self.tokens += accepted + 1
        if opening:  # an opening is judged against openings, not taken as the reply's
            for i, (long, reply) in enumerate(zip(self.opening, self.reply_open)):
                if i >= reached:
                    if i > 0:  # as the body's long-run rates: unseen ones drift back
                        long.fade(self._long_idle)
                    continue
                x = 1.0 if i < accepted else 0.0
                long.add(x, self._long_gamma)
                reply.add(x, self._gamma)
            return
        for i, (long, reply, fast) in enumerate(zip(self.long, self.reply, self.fast)):
            if i >= reached:
                reply.fade(self._idle)
                if i > 0:  # unseen deeper rates drift back toward the chain of priors
                    long.fade(self._long_idle)
                continue
            x = 1.0 if i < accepted else 0.0
            long.add(x, self._long_gamma)
            reply.add(x, self._gamma)
            fast.add(x, self._fast_gamma)
            if fast.weight >= 3.0 and _shifted(fast, reply):
                self._on_shift(i)

    def _on_shift(self, i: int) -> None:
        """Acceptance at position i+1 moved within the reply: its evidence restarts from the
        recent cycles, and the deeper positions' (just as old) is dropped."""
        self.reply[i].total, self.reply[i].weight = self.fast[i].total, self.fast[i].weight
        for ev in self.reply[i + 1:]:
            ev.fade(0.0)
        self.shifts += 1

    def new_request(self, continues: bool = False) -> None:
        """The reply's evidence restarts; ``continues`` (the same conversation's next reply):
        the last reply's stays, as at most ``CARRIED`` observations a position."""
        for ev in self.fast:
            ev.fade(0.0)
        for ev in self.reply + self.reply_open:
            ev.fade(min(1.0, CARRIED / ev.weight) if continues and ev.weight > 0 else 0.0)
        self.tokens = 0

    def base(self) -> list[float]:
        """Long-run rates, shrunk toward their priors (``initial``'s rate for the position,
        else ``PRIOR_DECAY`` x the position before)."""
        out, prior = [], self.prior
        for acc, fixed in zip(self.long, self.priors):
            prior = prior if fixed is None else fixed
            k = PRIOR_WEIGHT if fixed is None else SEED_WEIGHT
            a = (acc.total + k * prior) / (acc.weight + k)
            out.append(a)
            prior = PRIOR_DECAY * a
        return out

    def opening_base(self, body: list[float]) -> list[float]:
        """Long-run rates of openings, shrunk toward the body's (``OPENING_PRIOR``)."""
        return [(ev.total + OPENING_PRIOR * b) / (ev.weight + OPENING_PRIOR)
                for b, ev in zip(body, self.opening)]

    def shift(self, base: list[float], opening: list[float]) -> float:
        """The most likely log-odds shift of this reply against ``base`` (its opening
        against ``opening``), under a Cauchy prior of scale ``SHIFT_SD`` (small shifts are
        doubted, large ones believed), by Newton steps from 0."""
        seen = [(_logit(b), ev.total, ev.weight) for b, ev in
                zip(base + opening, self.reply + self.reply_open) if ev.weight > 1e-6]
        shift = 0.0
        for _ in range(6):
            spread = SHIFT_SD ** 2 + shift ** 2
            grad, curv = -2.0 * shift / spread, 2.0 / spread
            for x, total, weight in seen:
                p = _sigmoid(x + shift)
                grad += total - weight * p
                curv += weight * p * (1 - p)
            step = _clip(grad / curv, 2.0)
            shift += step
            if abs(step) < 1e-4:
                break
        return shift

    def estimate(self, optimism: float = 0.0) -> tuple[list[float], list[float]]:
        """a_1..a_D for the current reply, and the same ``optimism`` standard errors higher
        (by the evidence behind each: the reply's own plus ``REPLY_PRIOR``)."""
        body = self.base()
        opening = self.opening_base(body)
        shift = self.shift(body, opening)
        base, own = (opening, self.reply_open) if self.in_opening else (body, self.reply)
        out, hopeful = [], []
        for b, ev in zip(base, own):
            p = _sigmoid(_logit(b) + shift)
            n = ev.weight + REPLY_PRIOR
            a = (ev.total + REPLY_PRIOR * p) / n
            out.append(a)
            hopeful.append(min(1.0, a + optimism * math.sqrt(a * (1 - a) / (1.0 + n))))
        return out, hopeful


class _Costs:
    """Cycle seconds by depth as a level (log seconds: how fast the machine runs now) plus a
    profile (log cost of each depth relative to the level); see the module docstring."""

    def __init__(self, max_depth: int, *, half_life: float, idle_half_life: float) -> None:
        self.level: float | None = None
        self.profile = [0.0] * (max_depth + 1)
        self.timed = [0.0] * (max_depth + 1)  # discounted count of timed cycles per depth
        self.known = [False] * (max_depth + 1)  # timed twice in this controller's life
        self.first: list[float | None] = [None] * (max_depth + 1)  # a first timing, held
        self.recent: list[float] = []  # the last residuals against the level, unclipped
        self._gamma, self._idle = _decay(half_life), _decay(idle_half_life)

    def observe(self, d: int, t: float) -> None:
        y, weight = math.log(t), 1.0
        if not self.known[d]:  # a depth's first cycle may compile its graphs (seconds, not
            if self.first[d] is None:  # milliseconds): it is held back until the second;
                self.first[d] = y  # the two count as two timings: their mean, or the
                return  # faster when they differ by more than CLIP
            first, self.first[d], self.known[d], weight = self.first[d], None, True, 2.0
            y = (y + first) / 2 if abs(y - first) <= CLIP else min(y, first)
        if self.level is None or self.timed[d] <= 0.5:
            guess = math.log(self.line()[d])
            if self.level is None:
                self.level = y - guess
            # not timed (lately): this cycle sets the profile
            self.profile[d] = guess + _clip(y - self.level - guess, FIRST_CLIP)
        else:
            residual = y - self.level - self.profile[d]
            r = _clip(residual - self._break(residual), CLIP)
            self.level += LEVEL_GAIN * r
            self.profile[d] += r / (self.timed[d] + 1.0)
        for e in range(len(self.timed)):
            self.timed[e] *= self._gamma if e == d else self._idle
        self.timed[d] += weight

    def _break(self, residual: float) -> float:
        """A level break: when the last ``BREAK`` residuals all lie beyond ``CLIP`` on one
        side, the machine now runs at another speed (other load started or stopped, or the
        level came from a slow start): the level moves by their median at once, instead of
        ``LEVEL_GAIN`` x ``CLIP`` a cycle. Returns that move (0.0 when none)."""
        self.recent = (self.recent + [residual])[-BREAK:]
        if len(self.recent) < BREAK or not (all(r > CLIP for r in self.recent)
                                            or all(r < -CLIP for r in self.recent)):
            return 0.0
        move = sorted(self.recent)[BREAK // 2]
        self.level += move
        self.recent = []
        return move

    def line(self) -> list[float]:
        """Relative cost by depth from a weighted least-squares line through the timed ones."""
        seen = [(d, math.exp(p), min(n, 10.0))
                for d, (p, n) in enumerate(zip(self.profile, self.timed)) if n > 0.05]
        c0, c1 = _fit(seen) if seen else (1.0, COST_SLOPE_PRIOR)
        return [max(c0 + c1 * d, 1e-9) for d in range(len(self.timed))]

    def seconds(self, optimism: float = 0.0) -> tuple[list[float], list[float]]:
        """t(0)..t(D) (0.0 for all when nothing was timed), and the same ``optimism``
        standard errors cheaper."""
        if self.level is None:
            return [0.0] * len(self.timed), [0.0] * len(self.timed)
        scale = math.exp(self.level)
        out, hopeful = [], []
        for p, n, guess in zip(self.profile, self.timed, self.line()):
            t = scale * (math.exp(p) if n >= 1.5 else guess)
            out.append(t)
            hopeful.append(t * (1 - optimism * COST_SPREAD / math.sqrt(1.0 + n)))
        return out, hopeful

    def load(self, costs: dict[int, float]) -> None:
        ref = min(costs.values())
        self.level = math.log(ref)
        for d, t in costs.items():
            self.profile[d], self.timed[d] = math.log(t / ref), 2.0


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
    c0 = mt - c1 * md
    floor = LINE_FLOOR * min(t for _, t, _ in seen)
    if c0 < floor:  # a steep line through deep depths only would cross zero before depth 0:
        c0 = floor  # an untimed shallow depth would cost ~nothing and score without bound
        c1 = max(0.0, (mt - c0) / md)
    return c0, c1


class AdaptiveDepth:
    """Chooses a depth in ``0..max_depth`` for each cycle; see the module docstring.

    ``initial`` (e.g. a previous controller's ``state()``, or numbers from the tuner) may hold
    ``"acceptance"``: conditional per-position rates, used as the positions' priors,
    ``"cost"``: {depth: seconds} (each worth two timed cycles) and ``"depth"``: the incumbent;
    when it gives costs for two or more depths the warm-up is skipped unless ``warmup`` is
    given. One controller may be reused across requests; call ``new_request()`` between them.
    """

    def __init__(self, max_depth: int, *, warmup: int | None = None, explore: float = 0.08,
                 explore_min: float = 0.02, explore_decay: float = 100.0, margin: float = 0.02,
                 half_life: float = 12.0, long_half_life: float = 150.0,
                 idle_half_life: float = 64.0, cost_half_life: float = 32.0,
                 prior: float = 0.6, seed: int = 0, initial: dict | None = None) -> None:
        if max_depth < 0:
            raise ValueError("max_depth must be >= 0")
        if not 0.0 <= explore_min <= explore <= 1.0:
            raise ValueError("need 0 <= explore_min <= explore <= 1")
        self.max_depth = max_depth
        self.explore, self.explore_min, self.explore_decay = explore, explore_min, explore_decay
        self.margin = margin
        self._rng = random.Random(seed)
        self._credit = self._rng.random()  # exploration "credit"; a random phase per seed
        self._acc = _Acceptance(max_depth, prior=prior, half_life=half_life,
                                long_half_life=long_half_life, idle_half_life=idle_half_life)
        self._cost = _Costs(max_depth, half_life=cost_half_life,
                            idle_half_life=4 * idle_half_life)
        self._cycles = 0  # observed cycles
        self._since_request = 0
        self._incumbent: int | None = None
        seeded = self._load(initial or {})
        if warmup is None:
            warmup = 0 if seeded else 2 * (max_depth + 1)  # every depth twice
        self.warmup = warmup if max_depth > 0 else 0
        self._schedule = [max_depth] + list(range(max_depth))  # D, 0, 1, ..., D-1

    # -- estimates -------------------------------------------------------------------------
    @property
    def warming_up(self) -> bool:
        """``choose`` still follows the warm-up schedule (every depth in turn)."""
        return self.max_depth > 0 and self._cycles < self.warmup

    @property
    def shifts(self) -> int:
        """How often a shift in acceptance within a reply was detected."""
        return self._acc.shifts

    def acceptance(self) -> list[float]:
        """Conditional acceptance a_1..a_D expected for the rest of the current reply."""
        return self._acc.estimate()[0]

    def costs(self) -> list[float]:
        """Estimated cycle seconds t(0)..t(D) (0.0 for all when nothing was timed yet)."""
        return self._cost.seconds()[0]

    def scores(self) -> list[float]:
        """Expected tokens per second for each depth 0..D."""
        return self._both_scores()[0]

    def optimistic_scores(self) -> list[float]:
        """``scores()`` with every estimate ``OPTIMISM`` standard errors in its favour."""
        return self._both_scores()[1]

    def _both_scores(self) -> tuple[list[float], list[float]]:
        a, a_hope = self._acc.estimate(OPTIMISM)
        t, t_hope = self._cost.seconds(OPTIMISM)
        return _rates(a, t), _rates(a_hope, t_hope)

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
        scores, hopeful = self._both_scores()
        best = max(range(len(scores)), key=lambda d: (scores[d], -d))  # ties -> lower depth
        reason = "best score"
        if self._incumbent is None:
            self._incumbent = best
        elif best != self._incumbent:
            margin = self.margin * (ZERO_MARGIN if 0 in (best, self._incumbent) else 1.0)
            if scores[best] > scores[self._incumbent] * (1.0 + margin):
                self._incumbent, reason = best, "switch"
            else:
                reason = "hold (hysteresis)"
        probe = self._probe(scores[self._incumbent], hopeful)
        if probe is not None:
            return probe, "explore"
        return self._incumbent, reason

    def _probe(self, incumbent_score: float, hopeful: list[float]) -> int | None:
        """A depth to run for one cycle, or None: a neighbour of the incumbent whose
        optimistic score beats the incumbent's score, else such a depth two away (cycle
        costs need not grow evenly: on this CPU a 3-token verify costs far more than a
        2-token one, so depth 2 can look worse than depths 1 and 3 alike). Probes are evenly
        spaced, at rate epsilon."""
        d = self._incumbent
        promising = [n for n in range(max(d - 2, 0), min(d + 2, self.max_depth) + 1)
                     if n != d and hopeful[n] > incumbent_score]
        options = [n for n in promising if abs(n - d) == 1] or promising
        if not options:
            return None
        self._credit += self.epsilon()
        if self._credit < 1.0:
            return None
        self._credit -= 1.0
        return options[0] if len(options) == 1 else self._rng.choice(options)

    def observe(self, stats: CycleStats, *, timed: bool = True,
                position: int | None = None) -> None:
        """Learn from a finished cycle (its drafted length, accepted count and time).
        ``timed=False``: one row of a batched cycle; its acceptance only (the batch gives the
        cycle's time once, ``observe_time``). ``position``: the tokens its reply had before it
        (after the first), when the controller does not follow that reply alone (a batch's
        rows share it); else the controller counts since ``new_request()``."""
        k = min(len(stats.drafted), self.max_depth)
        self._acc.observe(min(stats.accepted + 1, k), stats.accepted, position)
        if timed:
            self.observe_time(k, stats.t_total)

    def observe_time(self, depth: int, seconds: float) -> None:
        """A finished cycle that drafted ``depth`` tokens (a batch: its deepest row) took
        ``seconds`` (0: counted, not timed)."""
        if seconds > 0 and math.isfinite(seconds):
            self._cost.observe(min(depth, self.max_depth), seconds)
        self._cycles += 1
        self._since_request += 1

    def new_request(self, continues: bool = False) -> None:
        """A new prompt starts: its acceptance is learnt afresh (from the long-run rates),
        exploration restarts. ``continues``: the prompt continues the conversation whose reply
        this controller decoded last (an agent's next turn, a chat's next question): that
        reply's evidence stays behind the new one's, as a few observations (``CARRIED``)."""
        self._acc.new_request(continues)
        if not continues:
            self._since_request = 0

    # -- persistence -----------------------------------------------------------------------
    def state(self) -> dict:
        """Plain numbers that ``initial=`` accepts (JSON-serialisable): the long-run
        acceptance, the costs of the timed depths and the incumbent."""
        level, c = self._cost.level, self._cost
        return {
            "acceptance": [round(a, 4) for a in self._acc.base()],
            "cost": {str(d): math.exp(level + p) for d, (p, n) in
                     enumerate(zip(c.profile, c.timed)) if n > 0} if level is not None else {},
            "depth": self._incumbent,
        }

    def _load(self, initial: dict) -> bool:
        for i, a in enumerate(list(initial.get("acceptance") or [])[: self.max_depth]):
            self._acc.priors[i] = min(max(float(a), 0.0), 1.0)
        costs = {int(d): float(t) for d, t in (initial.get("cost") or {}).items()
                 if 0 <= int(d) <= self.max_depth and float(t) > 0}
        if costs:
            self._cost.load(costs)
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
