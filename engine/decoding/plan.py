"""The typed state of one batched cycle as it goes through propose → verify → accept → commit:
``Cycle`` (each row's depth, drafts, the verify forward, the timings) and ``Group`` (rows that
draft and accept in one compiled call)."""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from engine.decoding.batch_caches import BatchVerified
from engine.decoding.drafters import Proposal
from engine.depth.controller import AdaptiveDepth
from engine.sampling import candidates
from engine.types import SamplingParams


@dataclass
class Group:
    """Rows of one cycle that draft and accept together: the same sampling parameters (no
    penalties, no grammar, compact candidates) and the same depth k >= 1. Each draft step is
    one ``candidates.compiled_draft_rows`` call and the acceptance one
    ``compiled_accept_rows`` call for all of them, each row with its own keys, so each gets
    what it would get alone; nothing is sliced per row until the host reads the results."""

    params: SamplingParams
    k: int
    rows: list[int]
    draft_keys: mx.array | None = None  # [R, k, 2]
    ids: list[mx.array] = field(default_factory=list)    # per draft step: q ids [R, K]
    probs: list[mx.array] = field(default_factory=list)  # q probs [R, K]
    exact: list[mx.array] = field(default_factory=list)  # [R]
    keys: mx.array | None = None        # acceptance keys [R, 2]
    verdict: tuple = ()                 # (n, extra, all target rows exact), each [R], lazy

    @property
    def index(self) -> mx.array:
        return mx.array(self.rows, dtype=mx.int32)

    def q(self, i: int) -> candidates.Candidates:
        """Row i's q rows [k, K] (for a dense redo)."""
        return candidates.Candidates(mx.stack(self.ids, axis=1)[i],
                                     mx.stack(self.probs, axis=1)[i],
                                     mx.stack(self.exact, axis=1)[i])


@dataclass
class Cycle:
    """One batched cycle in flight: each row's depth, draft and the verify forward."""

    ks: list[int]
    reasons: list[str]
    proposals: list[Proposal | None]
    inputs: list[list[int]] = field(default_factory=list)  # host ids, filled at the sync
    grid: mx.array | None = None    # [B, max k] every row's head drafts (MTP), padding included
    target: mx.array | None = None  # [B, S] verify argmax (when some row is greedy)
    ver: BatchVerified | None = None
    t0: float = 0.0
    controller: AdaptiveDepth | None = None  # the auto rows' (``Carryover.controller``)
    t_draft: float = 0.0
    t_verify: float = 0.0
    groups: list[Group] = field(default_factory=list)

    @property
    def grouped(self) -> set[int]:
        """The rows that draft and accept in a ``Group``."""
        return {b for g in self.groups for b in g.rows}


@dataclass(frozen=True)
class RowResult:
    """What the host read for one row: ``accepted`` drafts, the ``extra`` token after them
    (correction or bonus) and the ids ``drafted``."""

    accepted: int
    extra: int
    drafted: list[int]
