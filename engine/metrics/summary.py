"""One reply's numbers, computed once: ``ReplyTally`` folds a reply's events into a frozen
``ReplySummary`` that the CLI (``generate --json``), bench, the tuner, the app's chat stats
line and the dashboard all read. No other module recomputes a reply's tok/s or acceptance.

Definitions (the only ones in the project):
- **tok/s** (``ReplySummary.tokens_per_s``): tokens emitted by decode cycles divided by the
  cycles' own summed wall time (``CycleStats.t_total``). The first token comes out of the
  prefill and is counted in time to first token, not here. The engine measures both, so the
  figure does not depend on when a consumer (another thread, a GUI timer) saw the events.
- **acceptance rate** at draft position i (``PositionCounts.rate``): drafts accepted at i over
  cycles that drafted i (unconditional; expected tokens per cycle = 1 + the sum of the rates).
- **conditional acceptance** at i (``PositionCounts.conditional``): accepted at i over cycles
  that *reached* i, i.e. accepted every earlier draft.
- **draft acceptance** (``ReplySummary.draft_acceptance``): all accepted drafts over all
  drafted tokens.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from engine.types import MAX_DEPTH, CycleStats, Event, FinishReason


@dataclass(frozen=True)
class PositionCounts:
    """Counts at draft position ``position`` (1-based) over some cycles."""

    position: int
    drafted: int   # cycles that drafted this position
    reached: int   # of those, the cycles that accepted every earlier draft
    accepted: int  # drafts accepted at this position

    @property
    def rate(self) -> float | None:
        """Acceptance rate: accepted / drafted (unconditional)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def conditional(self) -> float | None:
        """Conditional acceptance: accepted / reached."""
        return self.accepted / self.reached if self.reached else None


class PositionTally:
    """Running per-position counts (the one place they are counted): ``add`` one cycle at a
    time, read ``counts()``. Position i (1-based) is *drafted* by a cycle with at least i
    drafts, *reached* when every earlier draft was accepted, *accepted* when draft i was."""

    def __init__(self) -> None:
        self.drafted: list[int] = []
        self.reached: list[int] = []
        self.accepted: list[int] = []

    def add(self, c: CycleStats) -> None:
        k = len(c.drafted)
        while len(self.drafted) < k:
            for lst in (self.drafted, self.reached, self.accepted):
                lst.append(0)
        for i in range(k):  # position i + 1
            self.drafted[i] += 1
            self.reached[i] += i <= c.accepted
            self.accepted[i] += i < c.accepted

    def counts(self, max_depth: int | None = None) -> tuple[PositionCounts, ...]:
        n = len(self.drafted) if max_depth is None else min(len(self.drafted), max_depth)
        return tuple(PositionCounts(i + 1, self.drafted[i], self.reached[i], self.accepted[i])
                     for i in range(n))


def position_counts(cycles: Iterable[CycleStats],
                    max_depth: int = MAX_DEPTH) -> tuple[PositionCounts, ...]:
    """Per-position counts over ``cycles``; one entry per position that was ever drafted."""
    tally = PositionTally()
    for c in cycles:
        tally.add(c)
    return tally.counts(max_depth)


@dataclass(frozen=True)
class ReplySummary:
    """What one reply cost and what speculation did; see the module docstring for the
    definitions. Plain data: it crosses to the app as it is."""

    tokens: int              # every token emitted, the prefill's first one included
    prompt_tokens: int
    reused_tokens: int       # prompt tokens taken from the prompt cache
    ttft_s: float            # prefill: start of the reply to its first token
    decode_tokens: int       # tokens emitted by decode cycles (tokens minus the first)
    decode_s: float          # the decode cycles' summed wall time
    cycles: int
    speculative_cycles: int  # cycles that drafted at least one token
    drafted: int
    accepted: int
    positions: tuple[PositionCounts, ...]
    depth_min: int           # smallest depth that drafted (0 when no cycle drafted)
    depth_max: int
    host_syncs: int
    finish_reason: FinishReason | None
    batch_max: int = 1       # the most streams this reply shared a cycle with (batching)

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tokens_per_cycle(self) -> float:
        return self.decode_tokens / self.cycles if self.cycles else 0.0

    @property
    def accepted_per_cycle(self) -> float:
        return self.accepted / self.cycles if self.cycles else 0.0

    @property
    def draft_acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def host_syncs_per_cycle(self) -> float:
        return self.host_syncs / self.cycles if self.cycles else 0.0

    def to_dict(self) -> dict:
        """JSON-ready: the fields, the derived figures, and both acceptance kinds by position."""
        d = asdict(self)
        d["positions"] = [asdict(p) for p in self.positions]
        d.update(tokens_per_s=self.tokens_per_s, tokens_per_cycle=self.tokens_per_cycle,
                 accepted_per_cycle=self.accepted_per_cycle,
                 draft_acceptance=self.draft_acceptance,
                 host_syncs_per_cycle=self.host_syncs_per_cycle,
                 acceptance_rate_by_position=[p.rate for p in self.positions],
                 conditional_acceptance_by_position=[p.conditional for p in self.positions])
        return d


class ReplyTally:
    """Folds one reply's events, in order, into a ``ReplySummary`` (plus its tokens/text)."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.text = ""
        self.cycles: list[CycleStats] = []
        self._prompt = self._reused = 0
        self._ttft = 0.0
        self._finish: FinishReason | None = None

    def add(self, ev: Event) -> None:
        self.token_ids.extend(ev.token_ids)
        self.text += ev.text
        if ev.prefill is not None:
            self._prompt, self._reused = ev.prefill.prompt_tokens, ev.prefill.reused_tokens
            self._ttft = ev.prefill.seconds
        if ev.stats is not None:
            self.cycles.append(ev.stats)
        if ev.finish_reason is not None:
            self._finish = ev.finish_reason

    @property
    def finish_reason(self) -> FinishReason | None:
        return self._finish

    def summary(self) -> ReplySummary:
        return _summary(self.cycles, tokens=len(self.token_ids), prompt=self._prompt,
                        reused=self._reused, ttft=self._ttft, finish=self._finish)


def _summary(cs: list[CycleStats], *, tokens: int, prompt: int, reused: int, ttft: float,
             finish: FinishReason | None) -> ReplySummary:
    drafting = [c.depth for c in cs if c.depth > 0]
    return ReplySummary(
        tokens=tokens, prompt_tokens=prompt, reused_tokens=reused, ttft_s=ttft,
        decode_tokens=sum(len(c.emitted) for c in cs), decode_s=sum(c.t_total for c in cs),
        cycles=len(cs), speculative_cycles=len(drafting),
        drafted=sum(len(c.drafted) for c in cs), accepted=sum(c.accepted for c in cs),
        positions=position_counts(cs), depth_min=min(drafting, default=0),
        depth_max=max(drafting, default=0), host_syncs=sum(c.host_syncs for c in cs),
        finish_reason=finish, batch_max=max((c.batch_rows for c in cs), default=1))


def summarize(events: Iterable[Event]) -> ReplySummary:
    tally = ReplyTally()
    for ev in events:
        tally.add(ev)
    return tally.summary()


def round_rates(rates: Iterable[float | None], digits: int = 4) -> list[float | None]:
    """Rates rounded for JSON (None stays None: a position never drafted/reached)."""
    return [None if r is None else round(r, digits) for r in rates]


def summarize_cycles(cycles: Iterable[CycleStats]) -> ReplySummary:
    """The figures of decode cycles alone (e.g. pooled over several replies, as bench and the
    tuner do): ``tokens == decode_tokens``, no prefill, no finish reason."""
    cs = list(cycles)
    return _summary(cs, tokens=sum(len(c.emitted) for c in cs), prompt=0, reused=0, ttft=0.0,
                    finish=None)
