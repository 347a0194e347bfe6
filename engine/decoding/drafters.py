"""Drafters: who proposes the k tokens a cycle verifies.

A ``Drafter`` answers ``draft(request)`` with a ``Proposal``: k draft tokens (an MLX array,
possibly still lazy) and the distributions q they were sampled from (``None`` when each
draft is deterministic, i.e. q is one-hot). Exactness needs only that the drafts really come
from q (MTP_SPEC §5). ``undo(proposal)`` forgets a proposal whose cycle will never be
verified (cancel, or a consumer closing the reply early).

The product drafts with the model's own MTP head, for every row of a batch at once
(``engine.decoding.proposer``, through ``pick_draft``); a ``Drafter`` replaces it for a
stream: ``ReplayDrafter`` proposes a known continuation (e.g. the depth-0 output for the
same prompt), which measures the best-case speed of each depth on any model, MTP head or not.

Draft modes (``DraftMode``, the MTP drafter's policy at temperature > 0; every one is exact):
``"filtered"`` (default) samples from the head's distribution under the target's own
filters (top-k/top-p/min-p, penalties); ``"softmax"`` samples with temperature and penalties
only (no sort); ``"argmax"`` takes the head's top token (q one-hot), the cheapest. Greedy
decoding always drafts the argmax.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx
import numpy as np

from engine.sampling import candidates, exact as sampling
from engine.types import DraftMode, SamplingParams


@dataclass(frozen=True)
class DraftRequest:
    """What one row asks its drafter for: ``k`` tokens following ``x0`` (the pending token,
    already emitted as the last of ``generated``)."""

    x0: int
    k: int
    generated: Sequence[int]      # the tokens emitted so far in this reply
    params: SamplingParams
    counts: mx.array | None       # [V] penalty counts of ``generated`` (None: no penalties)
    key: mx.array | None          # this cycle's draft key (None when greedy)
    # structured output: ``allowed(drafts so far) -> [V] bool`` (``engine.sampling.grammar``); each
    # draft is then drawn from the masked distribution (and synchronised, to mask the next)
    allowed: Callable[[Sequence[int]], np.ndarray] | None = None


@dataclass(frozen=True)
class Proposal:
    tokens: mx.array              # [k] int32 (lazy)
    # the k draft distributions: [k, V], or compact (``engine.sampling.candidates``); None: argmax
    q: mx.array | candidates.Candidates | None

    @property
    def k(self) -> int:
        return self.tokens.shape[0]


class Drafter(Protocol):
    def draft(self, request: DraftRequest) -> Proposal:
        """Propose ``request.k`` (>= 1) tokens after ``request.x0``."""
        ...

    def undo(self, proposal: Proposal) -> None:
        """Forget ``proposal``: its cycle will not be verified."""
        ...


def _unfiltered(params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(params, top_p=1.0, top_k=0, min_p=0.0)


def stack_q(qs: list):
    """The k draft rows' q stacked (None when the drafts were argmax)."""
    if not qs:
        return None
    if isinstance(qs[0], candidates.Candidates):
        return candidates.Candidates.stack(qs)
    return mx.stack(qs)


def draft_counts(counts: mx.array | None, drafts: list[mx.array]) -> mx.array | None:
    """Penalty counts [1, V] for the next draft: the reply's plus the drafts before it."""
    if counts is None:
        return None
    return (sampling.add_counts(counts, mx.stack(drafts)) if drafts else counts)[None]


def pick_draft(logits: mx.array, params: SamplingParams, row_counts, key,
               mode: DraftMode) -> tuple[mx.array, mx.array | candidates.Candidates | None]:
    """One draft token (int32 scalar) from the head's logits [1, V] and the q row it was
    sampled from (None: argmax; compact ``Candidates`` when the filters allow, see
    ``engine.sampling.candidates``). What each row of the batched drafts draws (``engine.decoding.proposer``)."""
    if params.greedy or mode == "argmax":
        d = sampling.argmax_tokens(logits, params, row_counts)
        return d.reshape(()).astype(mx.int32), None
    if mode == "filtered" and candidates.applies(params, logits.shape[-1], logits.dtype):
        draw = candidates.compiled_draft(params, row_counts is not None)
        d, ids, probs, exact = draw(logits, key) if row_counts is None else \
            draw(logits, key, row_counts)
        return d.reshape(()), candidates.Candidates(ids, probs, exact)
    qp = params if mode == "filtered" else _unfiltered(params)
    q = sampling.build_probs(logits, qp, row_counts)
    d = sampling.sample(q, key)
    return d.reshape(()).astype(mx.int32), q[0]


class ReplayDrafter:
    """Replays ``continuation`` (deterministic drafts: q is one-hot)."""

    def __init__(self, continuation: Sequence[int]) -> None:
        self.continuation = list(continuation)

    def propose(self, generated: Sequence[int], k: int) -> list[int]:
        """k draft ids following ``generated`` (the tokens emitted so far)."""
        n = len(generated)
        if self.continuation[:n] != list(generated[:n]):
            # Off the script: propose a token that is rarely right, still a valid draft.
            return [generated[-1]] * k if generated else [0] * k
        out = self.continuation[n:n + k]
        return out + [out[-1] if out else 0] * (k - len(out))

    def draft(self, request: DraftRequest) -> Proposal:
        ids = self.propose(request.generated, request.k)
        return Proposal(tokens=mx.array(ids, dtype=mx.int32), q=None)

    def undo(self, proposal: Proposal) -> None:
        """Nothing to undo: replaying keeps no state."""
