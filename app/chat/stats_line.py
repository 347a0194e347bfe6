"""The line under a reply: tok/s, tokens per step, time to first token, tokens, acceptance
(plain words), and its tooltip with every figure in detail.

Every figure is read from the reply's ``engine.metrics.summary.ReplySummary`` (live, from the worker's
``finished``) or from what was persisted of it (``ReplySummary.to_dict()`` in the message's
``meta["stats"]``); nothing is recomputed here. Rows written by older versions (keys
``depth`` and ``acceptance_rate``) still read.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from engine.metrics.summary import ReplySummary


@dataclass(frozen=True)
class ReplyFigures:
    """The figures the line shows, whatever they were read from."""

    tokens: int = 0
    prompt_tokens: int = 0
    tokens_per_s: float = 0.0
    ttft_s: float | None = None
    cycles: int = 0
    tokens_per_cycle: float = 0.0
    accepted_per_cycle: float = 0.0
    depth_min: int = 0
    depth_max: int = 0
    draft_acceptance: float | None = None  # the acceptance rate: accepted / drafted

    @classmethod
    def of(cls, s: ReplySummary) -> ReplyFigures:
        return cls(tokens=s.tokens, prompt_tokens=s.prompt_tokens, tokens_per_s=s.tokens_per_s,
                   ttft_s=s.ttft_s if s.tokens else None, cycles=s.cycles,
                   tokens_per_cycle=s.tokens_per_cycle, accepted_per_cycle=s.accepted_per_cycle,
                   depth_min=s.depth_min, depth_max=s.depth_max,
                   draft_acceptance=s.draft_acceptance)

    @classmethod
    def from_meta(cls, d: Mapping) -> ReplyFigures:
        """A persisted summary: ``ReplySummary.to_dict()``, or an older row (a figure that
        is not a number reads as absent)."""
        def num(key: str, default=0):
            v = d.get(key, default)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            return v if ok else default

        depth_max = int(num("depth_max", num("depth", 0)) or 0)
        acceptance = num("draft_acceptance", num("acceptance_rate", None))
        return cls(tokens=int(num("tokens")), prompt_tokens=int(num("prompt_tokens")),
                   tokens_per_s=num("tokens_per_s", 0.0), ttft_s=num("ttft_s", None),
                   cycles=int(num("cycles")), tokens_per_cycle=num("tokens_per_cycle", 0.0),
                   accepted_per_cycle=num("accepted_per_cycle", 0.0),
                   depth_min=int(num("depth_min") or depth_max), depth_max=depth_max,
                   draft_acceptance=acceptance)


def figures(summary: ReplySummary | Mapping | None) -> ReplyFigures | None:
    if summary is None:
        return None
    if isinstance(summary, ReplySummary):
        return ReplyFigures.of(summary)
    return ReplyFigures.from_meta(summary) if isinstance(summary, Mapping) and summary else None


def seconds(t: float) -> str:
    """A short time, never "0.00 s": under 5 ms reads "<0.01 s"."""
    return "<0.01 s" if t < 0.005 else f"{t:.2f} s"


def format_stats(summary: ReplySummary | Mapping | None) -> str:
    """The line under a reply, in plain words (empty when there is no summary); the detailed
    figures are in ``stats_tooltip``."""
    return " · ".join(_parts(summary))


def shorter_stats(summary: ReplySummary | Mapping | None) -> list[str]:
    """Shorter forms of ``format_stats`` for a narrow column (the line stays one line): the
    acceptance rate goes first, then the time to first token, then the token count; the
    speed and tokens per step stay (the tooltip has every figure)."""
    parts, out = _parts(summary), []
    for drop in ("acceptance rate", "first token", " tokens"):
        kept = [p for p in parts if drop not in p or "per step" in p]
        if kept != parts and kept:
            parts = kept
            out.append(" · ".join(parts))
    return out


def _parts(summary: ReplySummary | Mapping | None) -> list[str]:
    f = figures(summary)
    if f is None:
        return []
    parts = []
    if f.tokens_per_s:
        parts.append(f"{f.tokens_per_s:.1f} tok/s")
    if f.cycles:
        parts.append(f"{f.tokens_per_cycle:.1f} tokens per step" if f.depth_max
                     else "no speculation")
    if f.ttft_s is not None:
        parts.append(f"first token {seconds(f.ttft_s)}")
    parts.append(f"{f.tokens} tokens")
    if f.depth_max and f.draft_acceptance is not None:
        parts.append(f"acceptance rate {f.draft_acceptance:.0%}")
    return parts


def stats_tooltip(summary: ReplySummary | Mapping | None) -> str:
    """Every figure of the reply, one per line, with what it means (empty without a summary)."""
    f = figures(summary)
    if f is None:
        return ""
    lines = []
    if f.tokens_per_s:
        lines.append(f"Speed: {f.tokens_per_s:.2f} tokens per second")
    if f.ttft_s is not None:
        lines.append(f"Time to first token (TTFT): {f.ttft_s:.3f} s")
    out = f"Tokens: {f.tokens} generated"
    lines.append(f"{out}, {f.prompt_tokens} in the prompt" if f.prompt_tokens else out)
    if f.cycles:
        if f.depth_max:
            low = f.depth_min or f.depth_max
            depths = f"depth {f.depth_max}" if low == f.depth_max else f"depths {low}–{f.depth_max}"
            lines.append(f"Speculation: {f.tokens_per_cycle:.2f} tokens per decoding step "
                         f"({f.accepted_per_cycle:.2f} drafted tokens accepted per step, "
                         f"{depths}, {f.cycles} steps)")
        else:
            lines.append(f"No speculation: one token per step ({f.cycles} steps)")
    if f.depth_max and f.draft_acceptance is not None:
        lines.append(f"Acceptance rate: {f.draft_acceptance:.0%} of drafted tokens accepted")
    return "\n".join(lines)
