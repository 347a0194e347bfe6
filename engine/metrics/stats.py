"""Running aggregates over decode events, cheap enough to keep on all the time.

``StatsAggregator`` is fed the engine's own per-cycle measurements (``CycleStats``,
``PrefillStats``) and never touches the model: no MLX evaluation, no host sync. Rates are
computed from the cycles' own ``t_total`` (decode time), so they stay right even when the
events reach the aggregator late (e.g. queued across threads). The injected ``clock`` only
decides what falls inside the time window and when memory is sampled.

Not thread-safe: feed it and read it from one thread (the dashboard's GUI thread, or the
engine's CLI loop).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.metrics.summary import PositionTally, ReplySummary, ReplyTally
from engine.types import CycleStats, Event, PrefillStats

log = logging.getLogger(__name__)

INSTANT_SECONDS = 1.0  # "instant" tok/s covers at least this much decode time...
INSTANT_MAX_CYCLES = 64  # ...or at most this many recent cycles
RECENT_CYCLES = 32  # the time split ("waterfall") averages this many recent cycles
SMOOTHING = 0.1  # EWMA weight of one new observation in the smoothed acceptance rates
DEPTH_HISTORY = 2000  # points of depth history kept
MEMORY_PERIOD_S = 0.5  # memory is sampled at most this often
SERIES_BUCKET_S = 1.0  # resolution of the tok/s time series
# Acceptance is kept per context length (the tokens before a cycle), in these bands: a head
# that drafts well on short chats can fall off in a long agent session (issue 31).
CONTEXT_EDGES = (2048, 8192, 32768, 131072)


@dataclass(frozen=True)
class PositionStats:
    """Acceptance at draft position ``position`` (1-based): the counts and both rates of
    ``engine.metrics.summary.PositionCounts`` (same definitions; 0.0 where it says None), plus
    ``smoothed``, an EWMA of the per-cycle accept indicator (weight ``SMOOTHING``,
    bias-corrected).
    """

    position: int
    drafted: int
    reached: int
    accepted: int
    rate: float
    conditional: float
    smoothed: float


@dataclass(frozen=True)
class TimeSplit:
    """Seconds spent in each phase of a cycle; ``sync`` is the wait on the cycle's host
    synchronisation (work of every phase finishing there, unless profiled); ``other`` = total
    minus the named parts."""

    draft: float = 0.0
    verify: float = 0.0
    accept: float = 0.0
    commit: float = 0.0
    other: float = 0.0
    sync: float = 0.0

    @classmethod
    def of(cls, c: CycleStats) -> "TimeSplit":
        named = c.t_draft + c.t_verify + c.t_accept + c.t_commit + c.t_sync
        return cls(draft=c.t_draft, verify=c.t_verify, accept=c.t_accept, commit=c.t_commit,
                   sync=c.t_sync, other=max(0.0, c.t_total - named))

    def plus(self, other: "TimeSplit", scale: float = 1.0) -> "TimeSplit":
        """``self + scale * other``, phase by phase."""
        return TimeSplit(**{f: getattr(self, f) + scale * getattr(other, f) for f in _PHASES})

    @property
    def total(self) -> float:
        return self.draft + self.verify + self.accept + self.commit + self.sync + self.other


_PHASES = ("draft", "verify", "accept", "commit", "other", "sync")


@dataclass(frozen=True)
class DepthPoint:
    """The depth of one cycle: ``seq`` counts cycles across requests (0-based)."""

    seq: int
    depth: int
    reason: str


@dataclass(frozen=True)
class MemorySample:
    """Bytes: MLX active/peak (None when MLX is not loaded) and the process RSS."""

    active_bytes: int | None
    peak_bytes: int | None
    rss_bytes: int | None
    at: float


@dataclass(frozen=True)
class ContextBand:
    """The speculative cycles whose context (tokens before the cycle) lay in [lo, hi)."""

    lo: int
    hi: int | None  # None: no upper bound
    cycles: int
    drafted: int   # draft tokens proposed
    accepted: int  # of those, accepted
    emitted: int   # tokens the cycles produced (accepted drafts + one each)

    @property
    def tokens_per_cycle(self) -> float:
        return self.emitted / self.cycles if self.cycles else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def label(self) -> str:
        def k(n: int) -> str:
            return f"{n // 1024}k" if n else "0"
        return f"{k(self.lo)}–{k(self.hi)}" if self.hi is not None else f"≥{k(self.lo)}"


def context_band(tokens: int) -> int:
    """The index into ``CONTEXT_EDGES``' bands of a context of ``tokens``."""
    return sum(tokens >= e for e in CONTEXT_EDGES)


@dataclass(frozen=True)
class StatsSnapshot:
    """Everything the dashboard shows, computed from the events seen so far."""

    elapsed: float  # clock seconds since the aggregator was made (x axis of ``tps_series``)
    requests: int
    active: bool
    last_finish_reason: str | None
    cycles: int
    tokens: int
    decode_seconds: float
    tps_instant: float
    tps_window: float
    tps_series: tuple[tuple[float, float], ...]
    ttft_s: float | None
    prefill_tps: float | None
    prompt_tokens: int
    reused_tokens: int
    positions: tuple[PositionStats, ...]
    spec_cycles: int
    accepted_mean: float
    tokens_per_cycle: float
    accepted_hist: tuple[int, ...]
    corrections: int
    bonuses: int
    plain: int
    time_recent: TimeSplit
    time_total: TimeSplit
    profiled: bool  # the last cycle synchronised after each phase (a true time split)
    context_tokens: int
    current_depth: int | None
    depth_history: tuple[DepthPoint, ...]
    memory: MemorySample | None
    batch_rows: int = 1  # streams in the last cycle (engine.decoding): 1 when decoding alone
    by_context: tuple[ContextBand, ...] = ()  # the bands that saw speculative cycles


def read_memory() -> MemorySample:
    """MLX allocator counters (only if MLX is already imported) and the RSS. No GPU sync:
    the counters are plain reads of the allocator's bookkeeping."""
    active = peak = rss = None
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        try:
            active, peak = int(mx.get_active_memory()), int(mx.get_peak_memory())
        except (AttributeError, RuntimeError):  # older MLX: counters live under mx.metal
            active = peak = None
    try:
        import psutil

        rss = int(psutil.Process(os.getpid()).memory_info().rss)
    except (ImportError, OSError):
        rss = None
    return MemorySample(active, peak, rss, time.monotonic())


class _Ewma:
    """Bias-corrected exponentially weighted mean (equal to the plain mean at first)."""

    __slots__ = ("alpha", "num", "den")

    def __init__(self, alpha: float) -> None:
        self.alpha, self.num, self.den = alpha, 0.0, 0.0

    def add(self, x: float) -> None:
        self.num = (1 - self.alpha) * self.num + self.alpha * x
        self.den = (1 - self.alpha) * self.den + self.alpha

    @property
    def value(self) -> float:
        return self.num / self.den if self.den > 0 else 0.0


class StatsAggregator:
    """Aggregates one session's prefills and decode cycles.

    ``add_prefill`` starts a request, ``add_cycle`` records one decode cycle, ``finish`` ends
    the request and returns its summary; ``snapshot`` is a frozen view of everything.
    ``memory_probe`` (default ``read_memory``) is called at most every ``MEMORY_PERIOD_S``.
    """

    def __init__(self, window_s: float = 300.0, clock: Callable[[], float] = time.monotonic, *,
                 memory_probe: Callable[[], MemorySample] | None = read_memory) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._clock = clock
        self._t0 = clock()
        self._probe = memory_probe
        self._memory: MemorySample | None = None
        self._memory_at: float | None = None
        self._requests = 0
        self._active = False
        self._last_reason: str | None = None
        self._req = ReplyTally()
        self._req_prefill: PrefillStats | None = None
        self.last_reply: ReplySummary | None = None  # the last finished request's summary
        self._prefill: PrefillStats | None = None
        self._cycles = 0
        self._tokens = 0
        self._seconds = 0.0
        self._recent: deque[CycleStats] = deque(maxlen=max(INSTANT_MAX_CYCLES, RECENT_CYCLES))
        self._window: deque[tuple[float, int, float]] = deque()
        self._win_tokens = 0
        self._win_seconds = 0.0
        self._buckets: deque[list] = deque()  # [bucket index, tokens, seconds]
        self._positions = PositionTally()
        self._smooth: list[_Ewma] = []
        self._hist: list[int] = []
        self._spec_cycles = 0
        self._accepted_sum = 0
        self._kinds = {"correction": 0, "bonus": 0, "plain": 0, "none": 0}
        self._split = TimeSplit()
        self._context = 0
        self._depths: deque[DepthPoint] = deque(maxlen=DEPTH_HISTORY)
        # per context band: [cycles, drafted, accepted, emitted]
        self._bands = [[0, 0, 0, 0] for _ in range(len(CONTEXT_EDGES) + 1)]

    # -- feeding ---------------------------------------------------------------------------
    def add_prefill(self, stats: PrefillStats) -> None:
        """Start a request (a request without a prefill is started by its first cycle)."""
        self._begin()
        self._prefill = self._req_prefill = stats
        self._req.add(Event(token_ids=(), prefill=stats))
        self._context = stats.prompt_tokens
        self._maybe_sample_memory()

    def add_cycle(self, stats: CycleStats) -> None:
        if not self._active:
            self._begin()
        now = self._clock()
        n = len(stats.emitted)
        self._cycles += 1
        self._tokens += n
        self._seconds += stats.t_total
        self._recent.append(stats)
        self._add_window(now, n, stats.t_total)
        self._add_acceptance(stats)
        self._kinds[stats.extra_kind] = self._kinds.get(stats.extra_kind, 0) + 1
        self._split = self._split.plus(TimeSplit.of(stats))
        self._context = stats.context_tokens or self._context
        self._depths.append(DepthPoint(self._cycles - 1, stats.depth, stats.depth_reason))
        self._req.add(Event(token_ids=(), stats=stats))
        self._maybe_sample_memory(now)

    def finish(self, reason: str) -> dict:
        """End the current request; returns its figures (tokens, tok/s, TTFT, ...), computed
        by ``engine.metrics.summary`` from the cycles seen (``last_reply`` keeps the summary itself;
        ``tokens`` here are the decode cycles' tokens)."""
        r = self._req.summary()
        self.last_reply = r
        self._active = False
        self._last_reason = reason
        self._maybe_sample_memory()
        p = self._req_prefill
        return {
            "finish_reason": reason,
            "tokens": r.decode_tokens,
            "cycles": r.cycles,
            "decode_seconds": r.decode_s,
            "tokens_per_second": r.tokens_per_s,
            "ttft_s": p.seconds if p else None,
            "prompt_tokens": r.prompt_tokens,
            "prefill_tps": p.tokens_per_second if p else None,
            "tokens_per_cycle": r.tokens_per_cycle,
            "accepted_per_cycle": r.accepted_per_cycle,
            "acceptance": r.draft_acceptance,
        }

    def _begin(self) -> None:
        self._requests += 1
        self._active = True
        self._req = ReplyTally()
        self._req_prefill = None

    def _add_window(self, now: float, n: int, t: float) -> None:
        self._window.append((now, n, t))
        self._win_tokens += n
        self._win_seconds += t
        b = int((now - self._t0) // SERIES_BUCKET_S)
        if self._buckets and self._buckets[-1][0] == b:
            self._buckets[-1][1] += n
            self._buckets[-1][2] += t
        else:
            self._buckets.append([b, n, t])
        self._prune(now)

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        while self._window and self._window[0][0] < horizon:
            _, n, t = self._window.popleft()
            self._win_tokens -= n
            self._win_seconds -= t
        if not self._window:
            self._win_tokens, self._win_seconds = 0, 0.0
        first = int((horizon - self._t0) // SERIES_BUCKET_S)
        while self._buckets and self._buckets[0][0] < first:
            self._buckets.popleft()

    def _add_acceptance(self, stats: CycleStats) -> None:
        k = len(stats.drafted)
        if k == 0:
            return
        self._positions.add(stats)
        while len(self._smooth) < k:
            self._smooth.append(_Ewma(SMOOTHING))
        while len(self._hist) < k + 1:
            self._hist.append(0)
        a = min(stats.accepted, k)
        for i in range(k):  # position i + 1
            self._smooth[i].add(1.0 if i < a else 0.0)
        self._hist[a] += 1
        band = self._bands[context_band(stats.context_tokens)]
        for i, n in enumerate((1, k, a, len(stats.emitted))):
            band[i] += n
        self._spec_cycles += 1
        self._accepted_sum += a

    def _maybe_sample_memory(self, now: float | None = None) -> None:
        if self._probe is None:
            return
        now = self._clock() if now is None else now
        if self._memory_at is not None and now - self._memory_at < MEMORY_PERIOD_S:
            return
        self._memory_at = now
        try:
            self._memory = self._probe()
        except Exception:  # a broken probe must never stop the stats
            log.exception("memory probe failed")
            self._probe = None

    # -- reading ---------------------------------------------------------------------------
    def _instant(self) -> float:
        tokens, seconds = 0, 0.0
        for i, c in enumerate(reversed(self._recent)):
            if i >= INSTANT_MAX_CYCLES or seconds >= INSTANT_SECONDS:
                break
            tokens += len(c.emitted)
            seconds += c.t_total
        return tokens / seconds if seconds > 0 else 0.0

    def _recent_split(self) -> TimeSplit:
        cycles = list(self._recent)[-RECENT_CYCLES:]
        split = TimeSplit()
        for c in cycles:
            split = split.plus(TimeSplit.of(c), 1.0 / len(cycles))
        return split

    def _positions_now(self) -> tuple[PositionStats, ...]:
        return tuple(
            PositionStats(p.position, p.drafted, p.reached, p.accepted, p.rate or 0.0,
                          p.conditional or 0.0, self._smooth[p.position - 1].value)
            for p in self._positions.counts())

    def _by_context(self) -> tuple[ContextBand, ...]:
        edges = (0, *CONTEXT_EDGES, None)
        return tuple(ContextBand(edges[i], edges[i + 1], *counts)
                     for i, counts in enumerate(self._bands) if counts[0])

    def snapshot(self) -> StatsSnapshot:
        now = self._clock()
        self._prune(now)
        self._maybe_sample_memory(now)
        p = self._prefill
        series = tuple((b * SERIES_BUCKET_S, n / t) for b, n, t in self._buckets if t > 0)
        last = self._recent[-1] if self._recent else None
        return StatsSnapshot(
            elapsed=now - self._t0, requests=self._requests, active=self._active,
            last_finish_reason=self._last_reason,
            cycles=self._cycles, tokens=self._tokens, decode_seconds=self._seconds,
            tps_instant=self._instant(),
            tps_window=self._win_tokens / self._win_seconds if self._win_seconds > 0 else 0.0,
            tps_series=series,
            ttft_s=p.seconds if p else None,
            prefill_tps=p.tokens_per_second if p else None,
            prompt_tokens=p.prompt_tokens if p else 0,
            reused_tokens=p.reused_tokens if p else 0,
            positions=self._positions_now(), spec_cycles=self._spec_cycles,
            accepted_mean=self._accepted_sum / self._spec_cycles if self._spec_cycles else 0.0,
            tokens_per_cycle=self._tokens / self._cycles if self._cycles else 0.0,
            accepted_hist=tuple(self._hist),
            corrections=self._kinds["correction"], bonuses=self._kinds["bonus"],
            plain=self._kinds["plain"],
            time_recent=self._recent_split(), time_total=self._split,
            profiled=bool(last and last.host_syncs > 1),
            context_tokens=self._context,
            current_depth=last.depth if last else None,
            depth_history=tuple(self._depths),
            memory=self._memory,
            batch_rows=last.batch_rows if last else 1,
            by_context=self._by_context(),
        )
