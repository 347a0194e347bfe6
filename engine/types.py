"""Value types that cross the engine boundary. All frozen, all plain data (no MLX arrays)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Literal

from engine.errors import GenerationError

FinishReason = Literal["stop", "length", "cancelled"]

MAX_DEPTH = 6  # the deepest draft any cycle makes (the one place this number lives)

# How the MTP head's drafts are drawn at temperature > 0 (engine.decoding.drafters explains each).
Depth = int | Literal["auto"]  # 0..MAX_DEPTH, or "auto" (the adaptive controller chooses)
DraftMode = Literal["filtered", "softmax", "argmax"]
DRAFT_MODES: tuple[DraftMode, ...] = ("filtered", "softmax", "argmax")


def _real(name: str, value: object) -> float:
    """``value`` as a finite float, or a GenerationError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GenerationError(f"{name} must be a number, not {value!r}")
    if not math.isfinite(value):
        raise GenerationError(f"{name} must be a finite number, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy.

    ``top_k == 0`` and ``top_p == 1`` and ``min_p == 0`` disable those filters.
    Penalties apply to raw logits over the generated history (OpenAI semantics).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        """Raises ``GenerationError`` (a ``ValueError``) naming the first bad parameter."""
        if _real("temperature", self.temperature) < 0:
            raise GenerationError(f"temperature must be >= 0, not {self.temperature!r}")
        if not 0.0 < _real("top_p", self.top_p) <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise GenerationError(f"top_k must be an integer, not {self.top_k!r}")
        if self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0, not {self.top_k!r}")
        if not 0.0 <= _real("min_p", self.min_p) < 1.0:
            raise GenerationError(f"min_p must be in [0, 1), not {self.min_p!r}")
        _real("presence_penalty", self.presence_penalty)
        _real("frequency_penalty", self.frequency_penalty)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class PrefillStats:
    """What the prompt cost. ``reused_tokens`` came from the prompt cache."""

    prompt_tokens: int
    reused_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        done = self.prompt_tokens - self.reused_tokens
        return done / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class CycleStats:
    """One decode cycle: draft ``depth`` tokens, verify, accept, commit.

    ``emitted`` are the tokens this cycle produced (accepted drafts, then the correction or
    bonus token). ``from_draft[i]`` tells whether ``emitted[i]`` was an accepted draft.
    Depth-0 cycles have ``drafted == ()`` and ``extra_kind == "plain"``.
    Times are wall-clock seconds measured with at most one host sync per cycle.
    """

    index: int
    depth: int
    drafted: tuple[int, ...]
    accepted: int
    emitted: tuple[int, ...]
    from_draft: tuple[bool, ...]
    extra_kind: Literal["plain", "correction", "bonus", "none"]
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_accept: float = 0.0
    t_commit: float = 0.0
    t_sync: float = 0.0  # waiting on the cycle's host synchronisation (0 when profiled)
    t_total: float = 0.0
    context_tokens: int = 0
    host_syncs: int = 1
    depth_reason: str = ""
    batch_rows: int = 1  # streams decoded in this cycle (``engine.decoding``)


@dataclass(frozen=True)
class Event:
    """What ``Model.generate`` yields: new tokens (and their text) plus the cycle's stats.

    The first event of a generation carries ``prefill``; the last carries ``finish_reason``.
    ``text`` is the decoded delta (complete UTF-8 only; stop strings removed).
    """

    token_ids: tuple[int, ...]
    text: str = ""
    stats: CycleStats | None = None
    prefill: PrefillStats | None = None
    finish_reason: FinishReason | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded (or inspected) model is."""

    path: str
    name: str
    architecture: str
    family: str  # "qwen3_5" or "qwen3_5_moe"
    layout: Literal["hf", "mlx"]
    num_parameters: int
    bytes_on_disk: int
    quantization: dict | None
    has_mtp: bool
    mtp_layers: int
    max_depth: int
    context_length: int
    vocab_size: int
    hidden_size: int
    num_layers: int
    dtype: str
    eos_token_ids: tuple[int, ...] = ()
    supports_thinking: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    vision: bool = False  # a vision encoder is loaded: prompts may hold images (engine.vision)
