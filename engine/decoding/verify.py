"""An exactness check anyone can run (``python -m engine verify``): speculation must leave
the output unchanged.

Two parts, both through ``Model.generate`` (the one decoder, as the chat runs it):

* greedy: on a few fixed chat prompts the reply at depth k equals the reply at depth 0 token
  for token (each prompt: identical, or the first differing position);
* sampled: at the chat's default sampling settings (temperature 0.7, top-p 0.8, top-k 20, as
  ``app/chat/settings.ChatSettings``), N seeded 3-token replies at depth k against N at depth 0
  (disjoint seeds). The 2nd and 3rd tokens are the ones speculation decides through acceptance
  (the 1st comes from the prefill alone); each position's distribution is compared across the
  two depths with a chi-square homogeneity test (categories pooled until every expected count
  is >= 5). The check's p-value is the smallest position's, Bonferroni-corrected.

The verdict fails below ``THRESHOLD`` (p = 0.001): a correct engine fails about 1 run in 1,000
by chance; a broken acceptance rule (e.g. drafts always accepted) fails with p far below it.
N is sized from ``seconds`` by timing the first replies (or given as ``replies``). No Qt: the
app calls :func:`verify` with a ``progress(done, total, message)`` callback and a cancel Event.
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from engine.types import SamplingParams

THRESHOLD = 0.001
DEFAULT_DEPTH = 3
CHAT_SAMPLING = SamplingParams(temperature=0.7, top_p=0.8, top_k=20)
GREEDY_PROMPTS = ("Tell me a story.", "Write a short poem about the sea.",
                  "What is your favourite word?", "Explain how a rainbow forms.")
SAMPLED_PROMPT = "Tell me a story."
POSITIONS = (2, 3)  # 1-based positions in the reply that acceptance decides
MIN_EXPECTED = 5.0
MIN_REPLIES = 100
CALIBRATION = 20  # reply pairs timed before N is fixed
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class GreedyCase:
    """One prompt's greedy comparison: ``first_difference`` is the 0-based reply position of
    the first differing token (None when identical)."""

    prompt: str
    tokens: int
    identical: bool
    first_difference: int | None = None


@dataclass(frozen=True)
class PositionTest:
    """The chi-square homogeneity test of one reply position across the two depths."""

    position: int
    statistic: float
    dof: int
    p_value: float
    categories: int  # after pooling


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify` found; ``passed`` is the verdict, ``message`` says it in words."""

    model: str
    depth: int
    sampling: dict
    threshold: float
    greedy: tuple[GreedyCase, ...] = ()
    positions: tuple[PositionTest, ...] = ()
    replies: int = 0  # sampled replies at EACH depth
    p_value: float | None = None
    passed: bool = False
    cancelled: bool = False
    elapsed_s: float = 0.0
    message: str = ""
    compared: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class Cancelled(Exception):
    """The cancel Event was set."""


def default_depth(model) -> int:
    """The tuned depth for ``model`` on this machine if saved (and > 0), else 3; capped at
    the model's maximum."""
    from engine.hub.store import read_tuned_depth

    tuned = read_tuned_depth(model.info.path)
    depth = tuned if tuned and tuned > 0 else DEFAULT_DEPTH
    return max(1, min(depth, int(model.info.max_depth or DEFAULT_DEPTH)))


# ----------------------------------------------------------------------------- statistics

def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square(dof): the regularized upper incomplete gamma
    Q(dof/2, x/2), by its series (x small) or Lentz's continued fraction (Numerical Recipes)."""
    if dof <= 0 or x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    scale = math.exp(-z + a * math.log(z) - math.lgamma(a))
    if z < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= z / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return min(1.0, max(0.0, 1.0 - total * scale))
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, max(0.0, h * scale))


def pooled(a: Counter, b: Counter) -> list[tuple[int, int]]:
    """(count in a, count in b) per category, rare categories pooled into one until every
    expected count is >= ``MIN_EXPECTED`` (the smallest merged into the pool if need be)."""
    na, nb = sum(a.values()), sum(b.values())
    share = min(na, nb) / max(1, na + nb)  # the smaller row's share of a column
    cols = sorted(((a[t], b[t]) for t in set(a) | set(b)), key=lambda c: -(c[0] + c[1]))
    keep = [c for c in cols if (c[0] + c[1]) * share >= MIN_EXPECTED]
    rest = [c for c in cols if (c[0] + c[1]) * share < MIN_EXPECTED]
    pool = (sum(c[0] for c in rest), sum(c[1] for c in rest))
    while rest and keep and sum(pool) * share < MIN_EXPECTED:
        small = keep.pop()
        pool = (pool[0] + small[0], pool[1] + small[1])
    return keep + ([pool] if rest and sum(pool) * share >= MIN_EXPECTED else [])


def homogeneity(a: Counter, b: Counter) -> tuple[float, int, int]:
    """Chi-square homogeneity of two samples of one categorical variable ->
    (statistic, degrees of freedom, categories after pooling)."""
    cols = pooled(a, b)
    na, nb = sum(c[0] for c in cols), sum(c[1] for c in cols)
    total = na + nb
    stat = 0.0
    for ca, cb in cols:
        col = ca + cb
        for obs, row in ((ca, na), (cb, nb)):
            exp = row * col / total
            stat += (obs - exp) ** 2 / exp
    return stat, max(0, len(cols) - 1), len(cols)


# ----------------------------------------------------------------------------- the check

def _reply(model, ids, depth, sampling, seed, max_tokens) -> list[int]:
    return [t for e in model.generate(ids, max_tokens=max_tokens, depth=depth,
                                      sampling=sampling, seed=seed) for t in e.token_ids]


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled


def _greedy(model, prompts, depth, max_tokens, tick, cancel) -> tuple[GreedyCase, ...]:
    cases = []
    for text in prompts:
        ids = model.chat_ids([{"role": "user", "content": text}], enable_thinking=False)
        _check_cancel(cancel)
        plain = _reply(model, ids, 0, SamplingParams(), 0, max_tokens)
        _check_cancel(cancel)
        spec = _reply(model, ids, depth, SamplingParams(), 0, max_tokens)
        diff = next((i for i, (x, y) in enumerate(zip(plain, spec)) if x != y), None)
        if diff is None and len(plain) != len(spec):
            diff = min(len(plain), len(spec))
        cases.append(GreedyCase(text, len(plain), diff is None, diff))
        tick(f"greedy: {text!r} " + ("identical" if diff is None else f"differs at {diff}"))
    return tuple(cases)


def _sampled(model, ids, depth, sampling, seed, n, deadline, tick, cancel):
    """(counters at depth 0, counters at depth k) per position; ``n`` None: sized from
    ``deadline`` after timing ``CALIBRATION`` pairs."""
    plain = [Counter() for _ in POSITIONS]
    spec = [Counter() for _ in POSITIONS]
    i, start, target = 0, time.monotonic(), n
    while target is None or i < target:
        _check_cancel(cancel)
        for depth_i, counts in ((0, plain), (depth, spec)):
            toks = _reply(model, ids, depth_i, sampling, seed + 2 * i + (depth_i > 0), 3)
            for j, pos in enumerate(POSITIONS):
                counts[j][toks[pos - 1] if len(toks) >= pos else -1] += 1  # -1: ended early
        i += 1
        if target is None and i == CALIBRATION:
            per_pair = (time.monotonic() - start) / i
            target = max(MIN_REPLIES, i + int(max(0.0, deadline - time.monotonic()) / per_pair))
        tick(f"sampled: {i} reply pairs", target or CALIBRATION)
    return plain, spec, i


class _Ticker:
    """Counts steps for ``progress``: one per greedy prompt, one per sampled reply pair (the
    pairs' total is known once N is sized)."""

    def __init__(self, progress: Progress | None, greedy: int, pairs: int) -> None:
        self.progress, self.greedy, self.pairs, self.done = progress, greedy, pairs, 0

    def __call__(self, message: str, pairs: int | None = None) -> None:
        self.done += 1
        if pairs is not None:
            self.pairs = pairs
        if self.progress is not None:
            self.progress(self.done, self.greedy + self.pairs, message)


def verify(model, *, depth: int | None = None, seconds: float = 60.0,
           replies: int | None = None, sampling: SamplingParams = CHAT_SAMPLING,
           seed: int = 0, greedy_tokens: int = 48,
           greedy_prompts: tuple[str, ...] = GREEDY_PROMPTS,
           sampled_prompt: str = SAMPLED_PROMPT, threshold: float = THRESHOLD,
           progress: Progress | None = None,
           cancel: threading.Event | None = None) -> VerifyResult:
    """Check that depth ``depth`` (default :func:`default_depth`) decodes exactly as depth 0.
    ``replies``: sampled replies per depth (default: as many as ``seconds`` allows, at least
    ``MIN_REPLIES``). A set ``cancel`` ends the check early: ``cancelled`` and not ``passed``."""
    from engine.errors import GenerationError

    depth = default_depth(model) if depth is None else int(depth)
    if not model.info.has_mtp or not model.info.max_depth:
        raise GenerationError(f"{model.info.name} has no MTP head: it never speculates")
    if not 1 <= depth <= int(model.info.max_depth):
        raise GenerationError(f"depth must be in 1..{model.info.max_depth} for this model, "
                              f"not {depth}")
    start = time.monotonic()
    tick = _Ticker(progress, len(greedy_prompts), replies or CALIBRATION)
    base = {"model": model.info.name, "depth": depth, "sampling": asdict(sampling),
            "threshold": threshold}
    try:
        greedy = _greedy(model, greedy_prompts, depth, greedy_tokens, tick, cancel)
        ids = model.chat_ids([{"role": "user", "content": sampled_prompt}], enable_thinking=False)
        plain, spec, n = _sampled(model, ids, depth, sampling, seed, replies,
                                  start + seconds, tick, cancel)
    except Cancelled:
        return VerifyResult(**base, cancelled=True, elapsed_s=time.monotonic() - start,
                            message="Cancelled: no verdict.")
    tests = tuple(PositionTest(pos, s, d, chi2_sf(s, d), c) for pos, (s, d, c) in
                  zip(POSITIONS, (homogeneity(a, b) for a, b in zip(plain, spec))))
    return _verdict(base, greedy, tests, n, sampled_prompt, time.monotonic() - start)


def _verdict(base: dict, greedy, tests, n: int, prompt: str, elapsed: float) -> VerifyResult:
    informative = [t for t in tests if t.dof > 0]
    p = min(1.0, len(informative) * min(t.p_value for t in informative)) if informative else None
    same = sum(c.identical for c in greedy)
    greedy_ok = same == len(greedy)
    sampled_ok = p is not None and p >= base["threshold"]
    g = f"greedy replies identical on {same}/{len(greedy)} prompts"
    if not greedy_ok:
        g += " (" + ", ".join(f"{c.prompt!r} differs at token {c.first_difference}"
                              for c in greedy if not c.identical) + ")"
    what = f"{len(informative)} position{'s' * (len(informative) != 1)}, {n} replies each"
    if p is None:
        s = f"sampled tokens inconclusive (one outcome at every position, {n} replies each)"
    elif sampled_ok:
        s = f"sampled tokens match plain decoding (p = {p:.2g}, {what})"
    else:
        s = f"sampled tokens DIFFER from plain decoding (p = {p:.2g} < {base['threshold']:g}, {what})"
    passed = greedy_ok and sampled_ok
    head = ("Speculation left the output unchanged" if passed else
            "Speculation CHANGED the output" if p is not None or not greedy_ok else
            "No verdict")
    sp = base["sampling"]
    compared = (f"depth {base['depth']} against depth 0: greedy replies of up to "
                f"{max((c.tokens for c in greedy), default=0)} tokens on {len(greedy)} prompts; "
                f"tokens {' and '.join(str(t.position) for t in tests)} of {n} + {n} seeded "
                f"3-token replies to {prompt!r} at temperature {sp['temperature']}, top-p "
                f"{sp['top_p']}, top-k {sp['top_k']} (chi-square homogeneity per position; p: the "
                f"smallest position's, times the positions tested; fail below "
                f"p = {base['threshold']:g})")
    return VerifyResult(**base, greedy=tuple(greedy), positions=tuple(tests), replies=n,
                        p_value=p, passed=passed, elapsed_s=elapsed,
                        message=f"{head}: {g}; {s}.", compared=compared)
