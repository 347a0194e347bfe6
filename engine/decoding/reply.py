"""``Reply``: one reply as it is generated — what has been emitted and how it ends.

The reply owns the budget (``max_tokens`` clipped to the context), EOS and stop-string
finishing, the penalty counts over the generated history, detokenizing, and turning tokens
into ``Event``s. Plain (depth 0) and speculative decoding both emit through it, so a reply
ends the same way whatever decoded it. It never touches the model's caches (``Session``).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import mlx.core as mx

from engine.decoding.detok import StreamingText
from engine.sampling import exact as sampling
from engine.types import CycleStats, Event, FinishReason, PrefillStats


class Reply:
    def __init__(self, *, tokenizer, eos: Sequence[int], budget: int,
                 stop_strings: tuple[str, ...], vocab_size: int, penalties: bool,
                 cancel: threading.Event | None = None) -> None:
        self.eos = set(eos)
        self.budget = budget
        self.cancel = cancel
        self.stream = StreamingText(tokenizer, stop_strings, skip_ids=self.eos)
        self.counts: mx.array | None = (
            mx.zeros((vocab_size,), dtype=mx.float32) if penalties else None)
        self.generated: list[int] = []
        self.cycles = 0  # decode cycles emitted so far

    @property
    def remaining(self) -> int:
        return self.budget - len(self.generated)

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def cut(self, tokens: list[int]) -> tuple[list[int], FinishReason | None]:
        """The part of ``tokens`` the reply keeps: up to and including an EOS, within the
        budget; and the finish reason that makes (None: the reply goes on)."""
        for i, t in enumerate(tokens):
            if t in self.eos:
                return tokens[:i + 1], "stop"
        if len(tokens) >= self.remaining:
            return tokens[:self.remaining], "length"
        return tokens, None

    def count(self, tokens: mx.array) -> None:
        """Add ``tokens`` [n] to the penalty counts (lazy; a no-op without penalties)."""
        if self.counts is not None:
            self.counts = sampling.add_counts(self.counts, tokens)

    def next_cycle(self) -> int:
        """The index of the decode cycle about to be emitted (1-based)."""
        self.cycles += 1
        return self.cycles

    def emit(self, tokens: list[int], reason: FinishReason | None, *,
             stats: CycleStats | None = None, prefill: PrefillStats | None = None,
             counted: bool = False) -> Event:
        """Append ``tokens`` (already ``cut``) to the reply and return their event; a stop
        string ends the reply here. ``counted``: the penalty counts already hold them."""
        self.generated.extend(tokens)
        if not counted and tokens:
            self.count(mx.array(tokens, dtype=mx.int32))
        text = self.stream.add(tokens)
        if self.stream.stopped:
            reason = "stop"
        elif reason is not None:
            text += self.stream.flush()
        return Event(token_ids=tuple(tokens), text=text, stats=stats, prefill=prefill,
                     finish_reason=reason)

    def cancel_event(self) -> Event:
        return Event(token_ids=(), text=self.stream.flush(), finish_reason="cancelled")
