"""``Stream``: one request in a decoder — its sampling state (``Row``), its reply and where it
is (waiting, prefilling, a row of the batch, finished)."""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import mlx.core as mx

from engine.decoding.drafters import Drafter
from engine.decoding.reply import Reply
from engine.decoding.session import Session, Snapshot
from engine.sampling.grammar import Constraint
from engine.types import Depth, DraftMode, SamplingParams

RECENT = 64  # tokens of a row's context that decide whether it drafts on a draft vocabulary

_ids = itertools.count(1)


def new_id() -> str:
    return f"stream-{next(_ids)}"


@dataclass
class Row:
    """One reply's sampling state: how it draws and accepts tokens, whatever row it sits in."""

    reply: Reply
    params: SamplingParams
    keys: Iterator[mx.array]        # a fresh random key per use, in a fixed order (seeded)
    drafter: Drafter | None = None  # None: the batch drafts with the MTP head
    constraint: Constraint | None = None  # structured output (``engine.sampling.grammar``)
    draft_mode: DraftMode = "filtered"
    prompt_tail: tuple[int, ...] = ()     # the prompt's last ``RECENT`` tokens

    def recent(self) -> list[int]:
        """The last ``RECENT`` tokens of the prompt and the reply so far."""
        gen = self.reply.generated
        if len(gen) >= RECENT:
            return gen[-RECENT:]
        tail = self.prompt_tail
        return list(tail[max(0, len(tail) - (RECENT - len(gen))):]) + gen

    @property
    def greedy_fast(self) -> bool:
        """Greedy without penalties or a grammar: its acceptance is the verify argmax against
        its drafts, read on the host."""
        return self.params.greedy and self.reply.counts is None and self.constraint is None


@dataclass
class Stream:
    """One request in a ``BatchDecoder``: its reply and decode state."""

    id: str
    prompt: list[int]
    row: Row
    depth: Depth
    submitted: float = field(default_factory=time.perf_counter)
    session: Session | None = None      # while prefilling
    prefill: Iterator[int] | None = None
    reused: int = 0
    x0: int = -1                        # the pending token (emitted, not yet fed)
    after_prompt: Snapshot | None = None
    checkpoint: Snapshot | None = None  # before the generation prompt (``Carryover.checkpoint``)
    lineage: int = 0                    # its prompt-cache lineage (``session.PromptCache``)
    finished: bool = False
    images: tuple = ()                  # its prompt's placed images (``engine.vision.prompt``)

    @property
    def media(self) -> tuple:
        """What caches key its images on: (start, tokens, digest) of each."""
        return tuple(p.key for p in self.images)

    @property
    def reply(self) -> Reply:
        return self.row.reply

    @property
    def plain(self) -> bool:
        """A fixed depth-0 stream: sampled token by token, as plain decoding does."""
        return self.depth == 0
