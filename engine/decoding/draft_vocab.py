"""Drafting over part of the vocabulary (FR-Spec, Zhao et al. 2025): the MTP head's draft
steps score ``N`` of the LM head's ``V`` rows instead of all of them.

Why: a draft step is the head's one decoder layer plus the whole LM head, and at Qwen3.5's
248,320-token vocabulary the LM head is most of it: on the Qwen3.5-0.8B shape a depth-3
cycle's three draft steps cost 47 % of the cycle, nearly a plain step, while the head's layer
is 2 % of the model's weights (docs/benchmarks.md). Scoring 32,768 rows cuts each draft's LM
head 7.6-fold.

Which rows: the lowest ids, which byte-level BPE vocabularies (Qwen's among them) assign in
merge order, the most frequent pieces first; plus every added or special token (the chat's
``<|im_end|>``, ``<think>``, tool-call tags sit at the end of the vocabulary) and the
end-of-sequence ids. A token outside the set is never drafted; the verify still produces it.

Exactness is untouched: a draft is sampled from a distribution q over the set (greedy: its
argmax), and acceptance needs only that the draft was drawn from the q it is given, on the
whole vocabulary (zero outside the set: ``Candidates`` on real ids, or a dense q scattered
back). What changes is how often a draft is accepted: a target token outside the set costs
the cycle its drafts from there on.

The setting (``engine.decoding.window.draft_vocab_setting``): automatic (``DRAFT_VOCAB`` rows
where the LM head has ``DRAFT_VOCAB_FROM`` rows or more and is at least ``MIN_HEAD_SHARE`` of
the model; the demo's 4,096 keep them all), 0 for the whole vocabulary, or N. A batch drafts over the set only when none of its drafting rows
has a grammar (structured output scores the whole vocabulary: its mask is per token) and each
one's recent tokens mostly lie in the set (``DraftVocab.fits``, ``MAX_MISSES``): a conversation
in a script the low ids do not cover drafts over the whole vocabulary rather than lose its
acceptance.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.decoding.window import DRAFT_VOCAB, DRAFT_VOCAB_FROM, draft_vocab_setting

log = logging.getLogger(__name__)

_built: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {size: DraftVocab}

# A row drafts over the whole vocabulary while more than this share of its last tokens (the
# prompt's, then its reply's: ``stream.Row.recent``) lie outside the set. A target token
# outside the set ends the cycle's accepted drafts there; past ~10 % the draft steps saved no
# longer pay for the drafts lost on a large model (docs/benchmarks.md).
MAX_MISSES = 0.1

# The automatic setting takes a set only where the LM head is at least this share of the
# model's parameters (Qwen3.5 0.8B 32 %, 2B 25 %, 4B 16 %, 9B 11 %; 27B 4.7 %, the MoE models'
# share of all their experts under 2 %: those draft over the whole vocabulary unless
# ``MTPCHAT_DRAFT_VOCAB`` says otherwise).
MIN_HEAD_SHARE = 0.1


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


def choose_ids(vocab: int, size: int, always=()) -> list[int]:
    """``size`` ids of ``range(vocab)``: the ids of ``always`` (special tokens) inside it,
    then the lowest others; ascending. A set smaller than the special tokens holds the lowest
    of them."""
    keep = set(sorted({int(i) for i in always if 0 <= int(i) < vocab})[:size])
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
        return dict(weight=mx.take(module["weight"], ids, axis=0))
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


def head_share(model, vocab: int) -> float | None:
    """The LM head's share of the model's parameters (None: not known)."""
    info = model.info
    params = getattr(info, "num_parameters", 0) or 0
    hidden = getattr(info, "hidden_size", 0) or 0
    return vocab * hidden / params if params > 0 and hidden > 0 else None


def for_model(model) -> DraftVocab | None:
    """The model's draft vocabulary under the current setting (built once per model and
    size; None: draft over the whole vocabulary)."""
    module = model.head_rows() if model.mtp is not None else None
    if module is None:
        return None
    vocab = int(module["weight"].shape[0])
    size = wanted_size(vocab, draft_vocab_setting(), head_share(model, vocab))
    if size is None:
        return None
    per_model = _built.setdefault(model, {})
    if size not in per_model:
        ids = mx.array(choose_ids(vocab, size, special_ids(model)), dtype=mx.int32)
        fields = head_subset(module, ids)
        if fields is None:
            per_model[size] = None
        else:
            member = np.zeros(vocab, dtype=bool)
            member[np.array(ids)] = True
            sub = DraftVocab(ids=ids, vocab=vocab, member=member, **fields)
            mx.eval(sub.ids, sub.weight, *(a for a in (sub.scales, sub.biases) if a is not None))
            log.info("drafts score %d of the %d vocabulary rows", size, vocab)
            per_model[size] = sub
    return per_model[size]
