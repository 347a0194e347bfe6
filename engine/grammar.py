"""Structured output as token masks (llguidance): which tokens may come next.

Contract:
- ``Constraint.for_format(tokenizer, response_format, vocab_size=, eos_ids=)`` builds one from
  an OpenAI ``response_format`` (``{"type": "json_object"}`` or ``{"type": "json_schema",
  "json_schema": {"schema": {...}}}``); ``None`` for ``{"type": "text"}``. A schema that
  llguidance rejects raises ``GenerationError`` naming the problem.
- ``allowed(tentative=())`` is a ``[V]`` bool numpy mask of the tokens allowed after every
  committed token plus ``tentative`` (consumed and rolled back: the committed state does not
  move). ``allowed_rows(drafts)`` stacks the masks after each prefix ``drafts[:i]``, i = 0..k:
  exactly the rows a speculative verify scores. ``advance(tokens)`` commits emitted tokens.
- EOS is allowed only where the grammar may end; once the grammar is complete only EOS is.

Exactness under speculation: the decode loop masks the target distribution at every verified
row with ``allowed_rows`` and the draft distribution at every drafted position with the mask
after the earlier drafts, so acceptance preserves the masked target distribution and
speculative constrained output equals plain constrained decoding.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Sequence

import numpy as np

from engine.errors import GenerationError


@functools.lru_cache(maxsize=4)
def _ll_tokenizer(tokenizer, vocab_size: int, eos: int):
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)


def compile_format(response_format: dict) -> str | None:
    """The llguidance grammar for an OpenAI ``response_format`` (None for text); raises
    ``GenerationError`` for a format or schema that cannot be used."""
    import llguidance

    if not isinstance(response_format, dict):
        raise GenerationError("response_format must be an object such as {\"type\": \"json_object\"}.")
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema: dict = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise GenerationError("response_format.json_schema.schema must be a JSON schema object.")
    else:
        raise GenerationError(f"response_format type {kind!r} is not supported: use text, "
                              "json_object or json_schema.")
    # One space after ':' and ',' and none elsewhere: with free whitespace a small model can
    # pad forever (every space is valid JSON); the document is still any valid instance.
    schema = {**schema, "x-guidance": {"whitespace_flexible": False, "key_separator": ": ",
                                       "item_separator": ", ", **schema.get("x-guidance", {})}}
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GenerationError(f"The JSON schema cannot be used: {exc}") from exc


class Constraint:
    """The grammar state of one reply (see the module docstring)."""

    def __init__(self, matcher, vocab_size: int, eos: int) -> None:
        self._m = matcher
        self.vocab_size = vocab_size
        self.eos = eos

    @classmethod
    def for_format(cls, tokenizer, response_format: dict, *, vocab_size: int,
                   eos_ids: Sequence[int]) -> Constraint | None:
        import llguidance

        grammar = compile_format(response_format)
        if grammar is None:
            return None
        if not eos_ids:
            raise GenerationError("Structured output needs the model's end-of-sequence token.")
        lt = _ll_tokenizer(tokenizer, vocab_size, int(eos_ids[0]))
        matcher = llguidance.LLMatcher(lt, grammar)
        if matcher.is_error():
            raise GenerationError(f"The JSON schema cannot be used: {matcher.get_error()}")
        return cls(matcher, vocab_size, int(eos_ids[0]))

    def _mask(self) -> np.ndarray:
        words = np.frombuffer(self._m.compute_bitmask(), dtype="<u4")
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        return bits[: self.vocab_size].astype(bool)

    def allowed(self, tentative: Sequence[int] = ()) -> np.ndarray:
        return self.allowed_rows(tentative)[-1]

    def allowed_rows(self, drafts: Sequence[int]) -> np.ndarray:
        """``[len(drafts) + 1, V]`` masks after each prefix of ``drafts``. A draft the grammar
        refuses (possible only for drafts drawn without the mask) ends the rows early: later
        rows repeat the last valid one (they cannot be reached: that draft is rejected)."""
        rows, consumed = [self._mask()], 0
        for t in drafts:  # check before consuming: a refused token would stop the matcher
            if self._m.is_stopped() or not rows[-1][int(t)] or not self._m.consume_token(int(t)):
                break  # (once complete only EOS may follow: the last row says so)
            consumed += 1
            rows.append(self._mask())
        if consumed:
            self._m.rollback(consumed)
        while len(rows) < len(drafts) + 1:
            rows.append(rows[-1])
        return np.stack(rows)

    def advance(self, tokens: Sequence[int]) -> None:
        """Commit emitted tokens; once the grammar is complete the rest (EOS) is not checked."""
        for t in (int(t) for t in tokens):
            if self._m.is_stopped():
                return
            ends = t == self.eos and self._m.is_accepting()  # EOS is consumed, not validated
            if not ends and self._m.validate_tokens([t]) != 1:
                raise GenerationError(f"token {t} does not follow the grammar")
            self._m.consume_token(t)

    @property
    def finished(self) -> bool:
        return bool(self._m.is_stopped())


def masked(logits, allowed: np.ndarray):
    """``logits`` ([1, V] or [R, V], MLX) with every token ``allowed`` ([V] or [R, V]) does not
    permit set to -inf: softmax then gives them probability 0, argmax never picks them."""
    import mlx.core as mx

    keep = mx.array(allowed)
    if keep.ndim == 1:
        keep = keep[None]
    return mx.where(keep, logits, mx.array(-float("inf"), dtype=logits.dtype))
