"""Does a conversation fit the model's context? Plain arithmetic over estimated sizes (no Qt).

``context_budget(info, settings)`` is the room left for the prompt: the model's context length
less the room kept for the reply (its max tokens, at most an eighth of the context).
``plan_fit(sizes, budget)`` takes the prompt's parts in order, ``(message id, tokens)`` with
id None for the parts that always stay (the system prompt first, the new message last), and
says whether they fit, and if not which message the prompt should start at (``cut``: every
older message is left out) — always at a user turn, so the model never sees a reply without
its question. ``cut`` is None when even the kept parts alone do not fit.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fit:
    fits: bool
    need: int                  # estimated prompt tokens as it stands
    cut: int | None = None     # start the prompt at this message id
    dropped: int = 0           # how many messages that leaves out


def context_budget(info, settings) -> int | None:
    ctx = int(getattr(info, "context_length", 0) or 0)
    if ctx <= 0:
        return None
    return ctx - min(int(settings.max_tokens), ctx // 8)


def plan_fit(sizes: list[tuple[int | None, int]], budget: int,
             user_ids: set[int] | None = None) -> Fit:
    need = sum(n for _, n in sizes)
    if need <= budget:
        return Fit(True, need)
    kept = sum(n for mid, n in sizes if mid is None)
    droppable = [(mid, n) for mid, n in sizes if mid is not None]
    total = need
    for k, (_mid, n) in enumerate(droppable):
        total -= n
        rest = droppable[k + 1:]
        starts_at_user = not rest or user_ids is None or rest[0][0] in user_ids
        if total <= budget and starts_at_user and rest:
            return Fit(False, need, rest[0][0], k + 1)
    if kept <= budget:  # everything older goes; the prompt starts with the new message
        return Fit(False, need, _after(droppable), len(droppable))
    return Fit(False, need)


def _after(droppable: list[tuple[int | None, int]]) -> int:
    """A cut that leaves out every one of ``droppable`` (ids grow along a branch)."""
    return max(mid for mid, _ in droppable) + 1 if droppable else 0
