"""Drafting over part of the vocabulary (FR-Spec, Zhao et al. 2025): the MTP head's draft
steps score ``N`` of the LM head's ``V`` rows instead of all of them.

Why: a draft step is the head's one decoder layer plus the whole LM head, and at Qwen3.5's
248,320-token vocabulary the LM head is most of it: on the Qwen3.5-0.8B shape a depth-3
cycle's three draft steps cost 47 % of the cycle, nearly a plain step, while the head's layer
is 2 % of the model's weights (docs/benchmarks.md). Scoring 32,768 rows cuts each draft's LM
head 7.6-fold.

Which rows: every added or special token (the chat's ``<|im_end|>``, ``<think>``, tool-call
tags sit at the end of the vocabulary) and the end-of-sequence ids; then the tokens this model's
replies used most (``TokenCounts``: counted per model by the engine core's carryover, kept
with the weights' signature, so the set follows the languages and code a user works in); then
the lowest ids, which byte-level BPE vocabularies (Qwen's among them) assign in merge order,
the most frequent pieces first. A token outside the set is never drafted; the verify still
produces it. On Qwen's BPE the lowest 32,768 ids hold 94-95 % of English and Python tokens but
36-58 % of Chinese; a set learnt from half of a text holds 98 % and 94 % of the other half
(docs/benchmarks.md).

Exactness is untouched: a draft is sampled from a distribution q over the set (greedy: its
argmax), and acceptance needs only that the draft was drawn from the q it is given, on the
whole vocabulary (zero outside the set: ``Candidates`` on real ids, or a dense q scattered
back). What changes is how often a draft is accepted: a target token outside the set costs
the cycle its drafts from there on.

The setting (``engine.decoding.window.draft_vocab_setting``): automatic (``DRAFT_VOCAB`` rows
where the LM head has ``DRAFT_VOCAB_FROM`` rows or more and is at least ``MIN_HEAD_SHARE`` of
the weight bytes a step reads, an MoE's experts at top-k / experts: ``head_share``; the demo's
4,096 keep them all), 0 for the whole vocabulary, or N. A batch drafts
over the set only when none of its drafting rows has a grammar (structured output scores the
whole vocabulary: its mask is per token) and each one's recent tokens mostly lie in the set
(``DraftVocab.fits``, ``MAX_MISSES``): a conversation in a script the set does not cover yet
drafts over the whole vocabulary rather than lose its acceptance.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from engine.decoding.window import DRAFT_VOCAB, DRAFT_VOCAB_FROM, draft_vocab_setting
from engine.models import cpu_products

log = logging.getLogger(__name__)

# model -> {size: (counts version, DraftVocab | None)}: the latest set of each size
_built: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

# A row drafts over the whole vocabulary while more than this share of its last tokens (the
# prompt's, then its reply's: ``stream.Row.recent``) lie outside the set. A target token
# outside the set ends the cycle's accepted drafts there; past ~10 % the draft steps saved no
# longer pay for the drafts lost on a large model (an estimate from the cycle costs in
# docs/benchmarks.md, not measured on real weights).
MAX_MISSES = 0.1

# The automatic setting takes a set only where the LM head is at least this share of the
# model's parameters (Qwen3.5 0.8B 32 %, 2B 25 %, 4B 16 %, 9B 11 %; 27B 4.7 %, the MoE models'
# share of all their experts under 2 %: those draft over the whole vocabulary unless
# ``MTPCHAT_DRAFT_VOCAB`` says otherwise).
MIN_HEAD_SHARE = 0.1

LEARN_FROM = 2048   # reply tokens counted before they rank the set (then at 2x, 4x, ... as many)
KEEP = 65536        # most used ids kept on disk per model


@dataclass(frozen=True, eq=False)
class DraftVocab:
    """``ids`` [N] int32 (ascending): the vocabulary ids a draft step scores; ``rows``: the LM
    head's rows for them (their own copy, so a step reads N rows, not V), as ``weight`` of a
    plain head or (``weight``, ``scales``, ``biases``) of a quantized one."""

    ids: mx.array
    vocab: int                      # the LM head's rows, V
    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    quant: tuple | None = None      # (group_size, bits, mode) of a quantized head
    member: np.ndarray | None = None  # [V] bool on the host: in the set

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])

    def fits(self, recent: list[int]) -> bool:
        """Whether a row whose last tokens are ``recent`` drafts on the set: at most
        ``MAX_MISSES`` of them lie outside it (a conversation in a script the set's ids do
        not cover drafts over the whole vocabulary instead)."""
        if self.member is None or not recent:
            return True
        ids = np.asarray(recent, dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < self.vocab)]
        return int((~self.member[ids]).sum()) <= MAX_MISSES * len(recent)

    def logits(self, h: mx.array) -> mx.array:
        """[..., N] logits of the hidden ``h`` [..., H] (the LM head's input) on the set."""
        if self.quant is None:
            return h @ self.weight.T
        group_size, bits, mode = self.quant
        return mx.quantized_matmul(h, self.weight, scales=self.scales, biases=self.biases,
                                   transpose=True, group_size=group_size, bits=bits, mode=mode)

    def to_vocab(self, idx: mx.array) -> mx.array:
        """Positions in the set -> vocabulary ids (int32, same shape)."""
        return mx.take(self.ids, idx.astype(mx.int32), axis=0)

    def counts(self, counts: mx.array | None) -> mx.array | None:
        """Penalty counts [R, V] restricted to the set [R, N]."""
        return None if counts is None else mx.take(counts, self.ids, axis=-1)

    def dense(self, q: mx.array) -> mx.array:
        """A dense q [..., N] on the set as q [..., V] on the vocabulary (zero elsewhere)."""
        out = mx.zeros((*q.shape[:-1], self.vocab), dtype=q.dtype)
        return mx.put_along_axis(out, mx.broadcast_to(self.ids, q.shape), q, axis=-1)


def choose_ids(vocab: int, size: int, always=(), ranked=()) -> list[int]:
    """``size`` ids of ``range(vocab)``: the ids of ``always`` (special tokens) inside it,
    then those of ``ranked`` in its order (the most used first), then the lowest others;
    ascending. A set smaller than the special tokens holds the lowest of them."""
    keep = set(sorted({int(i) for i in always if 0 <= int(i) < vocab})[:size])
    for t in ranked:
        if len(keep) >= size:
            break
        if 0 <= int(t) < vocab:
            keep.add(int(t))
    i = 0
    while len(keep) < size:
        keep.add(i)
        i += 1
    return sorted(keep)


def special_ids(model) -> set[int]:
    """The ids a draft vocabulary always holds: the tokenizer's added and special tokens and
    the model's end-of-sequence ids."""
    out = set(model.info.eos_token_ids or ())
    tok = model.tokenizer
    out.update(getattr(tok, "all_special_ids", None) or ())
    try:
        out.update((tok.get_added_vocab() or {}).values())
    except (AttributeError, TypeError):
        pass
    return out


def head_subset(module, ids: mx.array) -> dict | None:
    """The head module's rows ``ids`` as DraftVocab fields, or None for a module it cannot
    cut (a bias, an unknown kind)."""
    if "bias" in module:
        return None
    if isinstance(module, (nn.QuantizedEmbedding, nn.QuantizedLinear)):
        biases = module.get("biases")
        return dict(weight=mx.take(module["weight"], ids, axis=0),
                    scales=mx.take(module["scales"], ids, axis=0),
                    biases=None if biases is None else mx.take(biases, ids, axis=0),
                    quant=(module.group_size, module.bits, getattr(module, "mode", "affine")))
    if isinstance(module, (nn.Embedding, nn.Linear)):
        return dict(weight=cpu_products.laid_out(mx.take(module["weight"], ids, axis=0)))
    return None


def wanted_size(vocab: int, setting: int | None, share: float | None = None) -> int | None:
    """The set's size for an LM head of ``vocab`` rows under ``setting`` (None: draft over the
    whole vocabulary). Automatic (``setting`` None): ``DRAFT_VOCAB`` rows where the head has
    ``DRAFT_VOCAB_FROM`` rows or more and is at least ``MIN_HEAD_SHARE`` of the model's
    parameters (``share``; None: unknown) — where it is less, the draft steps it saves are a
    small part of a cycle and the acceptance a set may cost would outweigh them."""
    if setting is None:
        big = vocab >= DRAFT_VOCAB_FROM and (share is None or share >= MIN_HEAD_SHARE)
        setting = DRAFT_VOCAB if big else 0
    return setting if 0 < setting < vocab else None


EXPERT_PATHS = (".switch_mlp.", ".experts.")  # MoE expert weights: [experts, ...] each
_shares: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> head_share


def head_share(model) -> float | None:
    """The LM head's share of the weight bytes a decode step reads (None: not known): its
    parameters against the trunk's and the MTP head's, MoE experts counted at top-k / experts
    (``num_experts_per_tok`` of the text model's args; all of them where it is not given).
    Bytes, not parameter counts, so that a quantized model (packed weights, scales) and a
    float one are judged alike."""
    if model in _shares:
        return _shares[model]
    head = model.head_rows()
    if head is None:
        return None
    k = getattr(getattr(model.trunk, "args", None), "num_experts_per_tok", None)
    total = 0.0
    for part in (model.trunk, model.mtp):
        for name, v in (tree_flatten(part.parameters()) if part is not None else ()):
            expert = k and v.ndim >= 3 and any(e in f".{name}" for e in EXPERT_PATHS)
            total += v.nbytes * (min(k, v.shape[0]) / v.shape[0] if expert else 1)
    own = sum(v.nbytes for _, v in tree_flatten(head.parameters()))
    share = _shares[model] = own / total if total > 0 and own > 0 else None
    return share


def _planned(model) -> tuple[object, int, int] | None:
    """(the head's module, its rows V, the set's size) under the current setting, or None
    where the model drafts over the whole vocabulary."""
    module = model.head_rows() if model.mtp is not None else None
    if module is None:
        return None
    vocab = int(module["weight"].shape[0])
    size = wanted_size(vocab, draft_vocab_setting(), head_share(model))
    return None if size is None else (module, vocab, size)


def wants_set(model) -> bool:
    """Whether the model drafts on a set under the current setting (its replies are then
    counted: ``TokenCounts``)."""
    return _planned(model) is not None


def for_model(model, counts: "TokenCounts | None" = None) -> DraftVocab | None:
    """The model's draft vocabulary under the current setting and ``counts`` (the tokens its
    replies used; built once per model, size and ``counts.version``: an older set of that size
    is dropped; None: draft over the whole vocabulary)."""
    planned = _planned(model)
    if planned is None:
        return None
    module, vocab, size = planned
    version = counts.version if counts is not None else 0
    per_model = _built.setdefault(model, {})
    got = per_model.get(size)
    if got is None or got[0] != version:
        ranked = counts.ranked() if counts is not None else ()
        ids = mx.array(choose_ids(vocab, size, special_ids(model), ranked), dtype=mx.int32)
        fields = head_subset(module, ids)
        sub = None
        if fields is not None:
            member = np.zeros(vocab, dtype=bool)
            member[np.array(ids)] = True
            sub = DraftVocab(ids=ids, vocab=vocab, member=member, **fields)
            mx.eval(sub.ids, sub.weight, *(a for a in (sub.scales, sub.biases) if a is not None))
            log.info("drafts score %d of the %d vocabulary rows (%d learnt)", size, vocab,
                     min(len(ranked), size))
        got = per_model[size] = (version, sub)
    return got[1]


class TokenCounts:
    """How often each token ended up in this model's replies: the ranking a draft vocabulary
    takes after the special tokens. ``version`` moves on when the counts have doubled since
    it last did (from ``LEARN_FROM`` tokens), so a set is rebuilt a handful of times as a
    user's history grows, not every reply. Kept with the model's weights signature
    (``engine.core.carryover``: ``store.write_token_counts``), the most used ``KEEP`` ids."""

    def __init__(self, counts: dict[int, int] | None = None) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.version = 0
        self.unsaved = 0
        self._at_version = 0
        for t, n in (counts or {}).items():
            if int(n) > 0 and int(t) >= 0:
                self.counts[int(t)] = int(n)
                self.total += int(n)
        self._bump()

    def add(self, tokens) -> None:
        for t in tokens:
            t = int(t)
            if t >= 0:
                self.counts[t] = self.counts.get(t, 0) + 1
        self.total += len(tokens)
        self.unsaved += len(tokens)
        self._bump()

    def _bump(self) -> None:
        if self.total >= LEARN_FROM and self.total >= 2 * self._at_version:
            self.version += 1
            self._at_version = self.total

    def ranked(self) -> list[int]:
        """Token ids by count, the most used first (ties: the lower id)."""
        return sorted(self.counts, key=lambda t: (-self.counts[t], t))

    def to_json(self) -> dict:
        return {str(t): self.counts[t] for t in self.ranked()[:KEEP]}

    @classmethod
    def from_json(cls, data) -> "TokenCounts":
        """From ``to_json``'s dict; anything malformed in it is left out."""
        counts = {}
        if isinstance(data, dict):
            for k, v in data.items():
                try:
                    counts[int(k)] = int(v)
                except (TypeError, ValueError):
                    continue
        return cls(counts)
