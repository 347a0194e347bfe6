"""What the dashboard shows about this session, gathered from the start (no Qt).

``SessionRecord`` receives every reply's stats and summary whether or not the dashboard window
exists, so a dashboard opened after some chatting shows the session so far. The chat window's
``AuxWindows`` feeds one; a ``DashboardWindow`` made without one keeps its own.
"""
from __future__ import annotations

import logging

from engine.metrics.stats import StatsAggregator
from engine.metrics.summary import ReplySummary, ReplyTally
from engine.types import CycleStats, Event, PrefillStats

log = logging.getLogger(__name__)


class SessionRecord:
    def __init__(self, aggregator: StatsAggregator | None = None) -> None:
        self.aggregator = aggregator or StatsAggregator()
        self.last_summary: ReplySummary | None = None
        self.live: ReplyTally | None = None  # the reply streaming now
        self.request_id: int | None = None
        self.finished = (0, 0)  # (replies, tokens) of the session's finished replies

    def add_stats(self, request_id: int, obj: object) -> bool:
        """Record a ``PrefillStats`` or ``CycleStats``; False for anything else (ignored)."""
        try:
            if isinstance(obj, CycleStats):
                self.aggregator.add_cycle(obj)  # (a request without a prefill starts here)
                event = Event(token_ids=obj.emitted, stats=obj)
            elif isinstance(obj, PrefillStats):
                self.aggregator.add_prefill(obj)
                event = Event(token_ids=(), prefill=obj)
            else:
                return False
            if self.live is None or request_id != self.request_id:
                self.live = ReplyTally()
            self.live.add(event)
            self.request_id = request_id
        except Exception:  # stats must never break the app
            log.exception("bad stats object %r", type(obj))
            return False
        return True

    def finish(self, reason: str, summary: ReplySummary) -> None:
        self.aggregator.finish(reason)
        self.last_summary = summary
        self.live = None
        replies, tokens = self.finished
        self.finished = (replies + 1, tokens + summary.tokens)

    def clear(self) -> None:
        self.aggregator = StatsAggregator(self.aggregator.window_s)
        self.last_summary = self.live = None
        self.finished = (0, 0)

    def reply_summary(self) -> ReplySummary | None:
        """The reply streaming now (as folded so far), else the last one."""
        return self.live.summary() if self.live is not None else self.last_summary

    def totals(self) -> tuple[int, int]:
        """(replies, tokens) so far, the streaming reply included."""
        replies, tokens = self.finished
        if self.live is not None:
            replies, tokens = replies + 1, tokens + len(self.live.token_ids)
        return replies, tokens
