"""The depth tuner: measure plain decoding against depths 1..N on this machine, keep a winner.

What it runs: every prompt of ``PROMPTS`` (six Python standard-library questions, the demo
model's domain, and two generic requests), each at depth 0 and at every requested depth,
``repeats`` times, greedy by default, ``max_tokens`` new tokens each. Depth order rotates from
one prompt to the next so slow drift (thermals, other load) hits every depth alike.

What it measures: decode speed, tokens / seconds from the first event (prefill done, first
token out) to the last one, on the given ``clock``, so prefill is excluded and every cost of a
cycle (drafting, verify, sampling, commit, host syncs) is included. A depth's speed is the
median over repeats of the whole prompt set's tokens / seconds. (This is the tuner's own
figure, on its injectable clock, so tests can drive it; ``ReplySummary.tokens_per_s`` sums the
engine's cycle times instead, and the two differ only by the consumer's time between events.)
Acceptance by position and tokens per cycle come from ``engine.metrics.summary`` over the cycles'
``CycleStats``.

What it keeps: the fastest depth, but only if it beats depth 0 by more than ``margin`` (3 %);
a depth within ``TIE`` (1 %) of the fastest and lower than it wins the tie. When nothing beats
plain decoding the result says so plainly and nothing is saved. A saved result goes through
``engine.hub.store.write_tuned`` (per model and machine) with ``best_depth`` and numbers that can
seed ``engine.depth.controller.AdaptiveDepth(initial=...)``.

Needs only ``model.chat_ids`` and ``model.generate`` (and ``model.info`` when present), so
tests drive it with a scripted fake model and a fake clock. On a real model ``generate`` is
a batch of one through the one decoder (``engine.decoding.decoder.BatchDecoder``), the same
cycles the app's chat and the server run, so the depth it saves was measured on the
product's path.
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from engine.errors import GenerationError
from engine.metrics.summary import ReplySummary, summarize_cycles
from engine.types import CycleStats, SamplingParams

log = logging.getLogger(__name__)

PROMPTS: tuple[str, ...] = (
    "How do I read a CSV file with the csv module?",
    "What does collections.Counter do? Show a short example.",
    "How do I parse command-line options with argparse?",
    "How can I list all .py files in a folder with pathlib?",
    "How do I pretty-print a dictionary with json.dumps?",
    "What is the difference between itertools.chain and itertools.product?",
    "Write a short poem about the sea.",
    "Give three tips for staying focused while studying.",
)
MARGIN = 0.03  # a depth must beat plain decoding by more than this to be kept
DEPTHS = (1, 2, 3, 4)  # the depths every tuner tries (the CLI's default and the app's)
TIE = 0.01  # a lower depth within this of the fastest wins the tie

ProgressFn = Callable[[int, int, str], None]


class _Cancelled(Exception):
    pass


@dataclass(frozen=True)
class TuneRow:
    """One depth's measurements. ``acceptance[i]``: share of drafts at position i+1 accepted;
    ``conditional[i]``: the same among cycles that reached position i+1."""

    depth: int
    tokens_per_second: float
    speedup: float
    acceptance: tuple[float, ...]
    conditional: tuple[float, ...]
    tokens_per_cycle: float
    cycle_ms: float
    runs: tuple[float, ...]
    tokens: int


@dataclass(frozen=True)
class TuneResult:
    model_path: str
    rows: tuple[TuneRow, ...]
    best_depth: int
    baseline_tps: float
    best_tps: float
    speedup: float
    saved: bool
    cancelled: bool
    message: str
    prompts: int
    repeats: int
    max_tokens: int
    sampling: dict = field(default_factory=dict)
    elapsed_s: float = 0.0

    def row(self, depth: int) -> TuneRow | None:
        return next((r for r in self.rows if r.depth == depth), None)

    def adaptive_initial(self) -> dict:
        """Priors for ``AdaptiveDepth(initial=...)``: the deepest row's conditional acceptance
        and every row's seconds per cycle."""
        deepest = max(self.rows, key=lambda r: r.depth, default=None)
        return {
            "acceptance": list(deepest.conditional) if deepest else [],
            "cost": {str(r.depth): r.cycle_ms / 1000 for r in self.rows if r.cycle_ms > 0},
            "depth": self.best_depth,
        }

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        d["adaptive_initial"] = self.adaptive_initial()
        return d


@dataclass
class _Tally:
    """Everything measured at one depth: tokens and seconds per repeat (on the tuner's
    clock) and every decode cycle, summarised by ``engine.metrics.summary``."""

    tokens: list[int] = field(default_factory=list)  # per repeat
    seconds: list[float] = field(default_factory=list)
    cycles: list[CycleStats] = field(default_factory=list)

    def add_cycle(self, stats: CycleStats) -> None:
        self.cycles.append(stats)

    def summary(self) -> ReplySummary:
        return summarize_cycles(self.cycles)


def tune(model, *, depths: Sequence[int] = DEPTHS, prompts: Sequence[str] | None = None,
         repeats: int = 3, max_tokens: int = 96, sampling: SamplingParams | None = None,
         progress: ProgressFn | None = None, cancel: threading.Event | None = None,
         save: bool = True, margin: float = MARGIN, warmup: bool = True,
         clock: Callable[[], float] = time.perf_counter) -> TuneResult:
    """Measure depth 0 and ``depths`` on ``model``; see the module docstring.

    ``progress(done, total, message)`` is called after every measured generation; setting
    ``cancel`` stops between (and inside) generations and returns a result with
    ``cancelled=True`` that is never saved. Raises ``GenerationError`` for a model without an
    MTP head or bad arguments.
    """
    depths = _check_depths(model, depths)
    if repeats < 1 or max_tokens < 2:
        raise GenerationError("repeats must be >= 1 and max_tokens >= 2")
    sampling = sampling or SamplingParams()
    texts = tuple(prompts) if prompts else PROMPTS
    ids = [model.chat_ids([{"role": "user", "content": p}]) for p in texts]
    all_depths = (0, *depths)
    tallies = {d: _Tally() for d in all_depths}
    total, done, t0 = repeats * len(ids) * len(all_depths), 0, clock()
    cancelled = False
    try:
        if warmup:  # first runs pay for lazy compilation and allocation; not counted
            for d in (0, depths[-1]):
                _measure(model, ids[0], d, min(max_tokens, 8), sampling, 0, cancel, clock, None)
        for r in range(repeats):
            for t in tallies.values():
                t.tokens.append(0)
                t.seconds.append(0.0)
            for j, prompt in enumerate(ids):
                k = (j + r) % len(all_depths)
                for d in all_depths[k:] + all_depths[:k]:
                    n, secs = _measure(model, prompt, d, max_tokens, sampling, r, cancel, clock,
                                       tallies[d])
                    tallies[d].tokens[-1] += n
                    tallies[d].seconds[-1] += secs
                    done += 1
                    if progress is not None:
                        progress(done, total, f"repeat {r + 1}/{repeats}, prompt {j + 1}/"
                                 f"{len(ids)}, depth {d}: {n / secs if secs > 0 else 0:.1f} tok/s")
    except _Cancelled:
        cancelled = True
    result = _result(model, tallies, texts, repeats, max_tokens, sampling, margin, cancelled,
                     clock() - t0)
    if save and result.best_depth > 0 and not cancelled:
        result = _save(model, result)
    return result


def _check_depths(model, depths: Sequence[int]) -> tuple[int, ...]:
    """Sorted, unique depths >= 1; those above the model's head depth are dropped (logged)."""
    info = getattr(model, "info", None)
    if info is not None and not info.has_mtp:
        raise GenerationError("This model has no MTP head: plain decoding is all it can do.")
    limit = info.max_depth if info is not None and info.max_depth > 0 else None
    asked = sorted({int(d) for d in depths})
    out = [d for d in asked if d >= 1 and (limit is None or d <= limit)]
    if not out or asked[0] < 1:
        top = limit if limit is not None else "N"
        raise GenerationError(f"depths must be between 1 and {top}, got {list(depths)}")
    if len(out) < len(asked):
        log.warning("depths above this model's %s dropped: %s", limit, asked[len(out):])
    return tuple(out)


def _measure(model, prompt: list[int], depth: int, max_tokens: int, sampling, seed: int,
             cancel, clock, tally: _Tally | None) -> tuple[int, float]:
    """One generation: (tokens after the first event, seconds from first to last event)."""
    if cancel is not None and cancel.is_set():
        raise _Cancelled
    start = last = None
    tokens = 0
    for ev in model.generate(prompt, max_tokens=max_tokens, depth=depth, sampling=sampling,
                             seed=seed, cancel=cancel):
        now = clock()
        if ev.finish_reason == "cancelled":
            raise _Cancelled
        if start is None:
            start = now  # prefill done and first token out: decoding starts here
            continue
        last = now
        tokens += len(ev.token_ids)
        if tally is not None and ev.stats is not None:
            tally.add_cycle(ev.stats)
    if start is None or last is None:
        return 0, 0.0
    return tokens, last - start


def _row(depth: int, t: _Tally, base: float) -> TuneRow:
    runs = tuple(n / s if s > 0 else 0.0 for n, s in zip(t.tokens, t.seconds))
    tps = statistics.median(runs) if runs else 0.0
    s = t.summary()
    return TuneRow(
        depth=depth, tokens_per_second=tps, speedup=tps / base if base > 0 else 0.0,
        acceptance=tuple(p.rate or 0.0 for p in s.positions),
        conditional=tuple(p.conditional or 0.0 for p in s.positions),
        tokens_per_cycle=s.tokens_per_cycle,
        cycle_ms=1000 * sum(t.seconds) / s.cycles if s.cycles else 0.0,
        runs=runs, tokens=sum(t.tokens))


def pick_winner(rows: Sequence[TuneRow], *, margin: float = MARGIN) -> int:
    """The depth to keep: the fastest if it beats depth 0 by > ``margin``; ties go lower."""
    base = next((r.tokens_per_second for r in rows if r.depth == 0), 0.0)
    contenders = [r for r in rows if r.depth > 0 and r.tokens_per_second > base * (1 + margin)]
    if not contenders:
        return 0
    best = max(r.tokens_per_second for r in contenders)
    return min(r.depth for r in contenders if r.tokens_per_second >= best * (1 - TIE))


def _result(model, tallies, texts, repeats, max_tokens, sampling, margin, cancelled,
            elapsed) -> TuneResult:
    measured = {d: t for d, t in tallies.items() if any(s > 0 for s in t.seconds)}
    base_row = _row(0, measured[0], 0.0) if 0 in measured else None
    base = base_row.tokens_per_second if base_row else 0.0
    rows = tuple(_row(d, t, base) for d, t in measured.items())
    winner = 0 if cancelled else pick_winner(rows, margin=margin)
    best = max(rows, key=lambda r: r.tokens_per_second, default=None)
    win_row = next((r for r in rows if r.depth == winner), None)
    win_tps = win_row.tokens_per_second if win_row else 0.0
    result = TuneResult(
        model_path=str(getattr(getattr(model, "info", None), "path", "")), rows=rows,
        best_depth=winner, baseline_tps=base, best_tps=win_tps,
        speedup=win_tps / base if base > 0 else 0.0, saved=False, cancelled=cancelled,
        message="", prompts=len(texts), repeats=repeats, max_tokens=max_tokens,
        sampling=asdict(sampling), elapsed_s=elapsed)
    return _with_message(result, best)


def _with_message(result: TuneResult, best: TuneRow | None) -> TuneResult:
    from dataclasses import replace

    if result.cancelled:
        msg = "Tuning was cancelled; nothing was saved."
    elif result.best_depth == 0:
        if best is None or best.depth == 0:
            tail = ""
        else:
            tail = f" (the best, depth {best.depth}, reached {best.speedup:.2f}x)"
        msg = (f"Nothing beats plain decoding on this machine{tail}: keep depth 0 "
               f"({result.baseline_tps:.1f} tok/s). Nothing was saved.")
    else:
        msg = (f"Depth {result.best_depth} is fastest: {result.best_tps:.1f} tok/s, "
               f"{result.speedup:.2f}x plain decoding ({result.baseline_tps:.1f} tok/s).")
    return replace(result, message=msg)


def _save(model, result: TuneResult) -> TuneResult:
    from dataclasses import replace

    from engine.hub import store

    if not result.model_path:
        log.warning("tuning result not saved: the model has no path")
        return result
    saved = replace(result, saved=True,
                    message=result.message + " Saved for this model on this machine.")
    store.write_tuned(result.model_path, saved.to_dict())
    return saved
