"""Output: turning a cycle's results into each stream's tokens, stats and events.

``cut`` ends each row's tokens (EOS, budget, its grammar advanced) and says how many drafts
each row keeps in its caches; ``events`` builds each row's ``CycleStats``, feeds the auto
rows' depth controller and emits through the row's ``Reply`` (detokenizing, stop strings).
"""
from __future__ import annotations

from engine.decoding import draw
from engine.decoding.acceptance import extra_kind
from engine.decoding.plan import Cycle, RowResult
from engine.decoding.stream import Stream
from engine.types import CycleStats, Event, FinishReason


def cut(streams: list[Stream], results: list[RowResult]
        ) -> tuple[list[tuple[list[int], FinishReason | None]], list[int]]:
    """Each row's emitted tokens and finish reason, and how many drafts it keeps (an EOS
    among the accepted drafts ends the reply there)."""
    cuts, keeps = [], []
    for st, r in zip(streams, results):
        tokens, reason = draw.cut(st.reply, r.drafted[:r.accepted] + [r.extra],
                                  st.row.constraint)
        cuts.append((tokens, reason))
        keeps.append(min(r.accepted, len(tokens)))
    return cuts, keeps


def events(c: Cycle, streams: list[Stream], results: list[RowResult], cuts, times: dict,
           context: list[int], *, host_syncs: int = 1) -> list[Event]:
    """Each row's event for this cycle (``context``: each row's fed tokens after it)."""
    out = []
    for b, st in enumerate(streams):
        n, drafted = results[b].accepted, results[b].drafted
        tokens, reason = cuts[b]
        stats = CycleStats(
            index=st.reply.next_cycle(), depth=c.ks[b], drafted=tuple(drafted),
            accepted=n, emitted=tuple(tokens),
            from_draft=tuple(i < n for i in range(len(tokens))),
            extra_kind="plain" if st.plain else extra_kind(len(tokens), n, c.ks[b]),
            context_tokens=context[b], depth_reason=c.reasons[b], batch_rows=len(streams),
            host_syncs=host_syncs, **times)
        if c.controller is not None and st.depth == "auto":
            c.controller.observe(stats, timed=False,  # each auto row's acceptance, and
                                 position=len(st.reply.generated) - 1)  # its opening
        out.append(st.reply.emit(tokens, reason, stats=stats))
        st.x0 = results[b].extra
    if c.controller is not None:  # the cycle's time, once, at the depth it was padded to
        c.controller.observe_time(max(c.ks), times["t_total"])
    return out
