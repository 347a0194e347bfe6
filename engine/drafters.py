"""Drafters: who proposes the k tokens a cycle verifies.

The MTP head is the product's drafter. ``ReplayDrafter`` proposes a known continuation (e.g.
the depth-0 output for the same prompt), which measures the best-case speed of each depth on
any model, MTP head or not. ``OracleDrafter``-style tests can subclass it.
"""
from __future__ import annotations

from typing import Protocol


class Drafter(Protocol):
    uses_mtp: bool

    def propose(self, generated: list[int], k: int) -> list[int]:
        """Up to k draft token ids following ``generated`` (the tokens emitted so far)."""
        ...


class ReplayDrafter:
    """Replays ``continuation`` (argmax-style drafts: q is one-hot)."""

    uses_mtp = False

    def __init__(self, continuation: list[int]) -> None:
        self.continuation = list(continuation)

    def propose(self, generated: list[int], k: int) -> list[int]:
        n = len(generated)
        if self.continuation[:n] != generated[:n]:
            # Off the script: propose a token that is rarely right, still a valid draft.
            return [generated[-1]] * k if generated else [0] * k
        out = self.continuation[n:n + k]
        return out + [out[-1] if out else 0] * (k - len(out))
