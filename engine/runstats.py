"""Summaries of one generation's events (used by the CLI, bench and tests)."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.types import CycleStats, Event


@dataclass
class RunSummary:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    ttft: float = 0.0
    prefill_tokens: int = 0
    decode_seconds: float = 0.0
    cycles: list[CycleStats] = field(default_factory=list)

    def add(self, ev: Event) -> None:
        self.token_ids.extend(ev.token_ids)
        self.text += ev.text
        if ev.prefill is not None:
            self.ttft = ev.prefill.seconds
            self.prefill_tokens = ev.prefill.prompt_tokens
        if ev.stats is not None:
            self.cycles.append(ev.stats)
            self.decode_seconds += ev.stats.t_total
        if ev.finish_reason is not None:
            self.finish_reason = ev.finish_reason

    @property
    def decode_tokens(self) -> int:
        return sum(len(c.emitted) for c in self.cycles)

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def acceptance_by_position(self, max_depth: int = 6) -> list[float | None]:
        """P(draft i accepted | drafts 1..i-1 accepted), per draft position."""
        drafted = [0] * max_depth
        accepted = [0] * max_depth
        for c in self.cycles:
            for i in range(min(c.depth, max_depth)):
                if i > c.accepted:
                    break
                drafted[i] += 1
                if i < c.accepted:
                    accepted[i] += 1
        return [accepted[i] / drafted[i] if drafted[i] else None for i in range(max_depth)]

    def to_dict(self, *, trace: bool = False) -> dict:
        spec = [c for c in self.cycles if c.depth > 0]
        d = {
            "token_ids": self.token_ids, "text": self.text, "finish_reason": self.finish_reason,
            "stats": {
                "tokens": len(self.token_ids), "prompt_tokens": self.prefill_tokens,
                "ttft_s": round(self.ttft, 6), "decode_tokens_per_s": round(self.tokens_per_second, 3),
                "cycles": len(self.cycles), "drafted": sum(c.depth for c in self.cycles),
                "accepted": sum(c.accepted for c in self.cycles),
                "tokens_per_cycle": round(self.decode_tokens / len(self.cycles), 4) if self.cycles else 0,
                "acceptance_by_position": [None if a is None else round(a, 4)
                                           for a in self.acceptance_by_position()],
                "host_syncs_per_cycle": (sum(c.host_syncs for c in self.cycles) / len(self.cycles))
                if self.cycles else 0,
                "speculative_cycles": len(spec),
            },
        }
        if trace:
            d["trace"] = [{"depth": c.depth, "drafted": list(c.drafted), "accepted": c.accepted,
                           "emitted": list(c.emitted), "kind": c.extra_kind,
                           "reason": c.depth_reason, "t_total": round(c.t_total, 6)}
                          for c in self.cycles]
        return d
