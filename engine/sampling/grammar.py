"""Structured output as token masks (llguidance): which tokens may come next.

Contract:
- ``Constraint.for_format(tokenizer, response_format, vocab_size=, eos_ids=)`` builds one from
  an OpenAI ``response_format`` (``{"type": "json_object"}`` or ``{"type": "json_schema",
  "json_schema": {"schema": {...}}}``); ``None`` for ``{"type": "text"}``. A schema that
  llguidance rejects, that admits no document at all (``{"$ref": "#"}``, a ``$ref`` loop), or
  that is over the size limits (``check_schema``: nesting, nodes, properties — past them
  llguidance's parser gives up mid-reply) raises ``GenerationError`` naming the problem.
  ``Constraint.build(ll_tokenizer(...), compile_format(response_format), ...)`` is the same
  in two steps, from an llguidance tokenizer: neither needs the model's tokenizer, so a
  server compiles on a worker thread of its own and hands the built constraint to the
  decoding thread.
- ``allowed(tentative=())`` is a ``[V]`` bool numpy mask of the tokens allowed after every
  committed token plus ``tentative`` (consumed and rolled back: the committed state does not
  move). ``allowed_rows(drafts)`` stacks the masks after each prefix ``drafts[:i]``, i = 0..k:
  exactly the rows a speculative verify scores. ``advance(tokens)`` commits emitted tokens.
- EOS is allowed only where the grammar may end; once the grammar is complete only EOS is.
- A grammar that fails during the reply (a parser limit reached) allows only EOS from then
  on, so the reply ends there, and ``error`` says why (None while it holds): the caller must
  report that reply as failed, not as finished.

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


# Past these a schema is refused up front. llguidance's parser holds at most 2,000 items in a
# row (about four per optional property of one object): past that it stops mid-reply.
MAX_SCHEMA_DEPTH = 64           # nested objects/arrays in the schema document
MAX_SCHEMA_NODES = 50_000       # values in the schema document, all levels
MAX_PROPERTIES = 5_000          # properties, all objects together (OpenAI's limit too)
MAX_OPTIONAL_PROPERTIES = 400   # properties one object may leave out


@functools.lru_cache(maxsize=4)
def ll_tokenizer(tokenizer, vocab_size: int, eos: int):
    """llguidance's view of ``tokenizer`` (built once per model: it reads the whole vocab)."""
    import llguidance.hf

    if not 0 <= eos < vocab_size:
        raise GenerationError(f"The model's end-of-sequence token {eos} is outside its "
                              f"vocabulary of {vocab_size}.")
    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)


_ll_tokenizer = ll_tokenizer


def check_schema(schema) -> None:
    """``GenerationError`` when ``schema`` is over the limits above (iterative: a deep schema
    cannot exhaust the stack here)."""
    nodes, properties, todo = 0, 0, [(schema, 1)]
    while todo:
        node, depth = todo.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise GenerationError(f"The JSON schema is too large (over {MAX_SCHEMA_NODES:,} "
                                  "values).")
        if isinstance(node, dict):
            children = list(node.values())
            props = node.get("properties")
            if isinstance(props, dict) and props:
                properties += len(props)
                required = node.get("required")
                required = set(required) if isinstance(required, list) and all(
                    isinstance(r, str) for r in required) else set()
                optional = len(props.keys() - required)
                if optional > MAX_OPTIONAL_PROPERTIES:
                    raise GenerationError(
                        f"The JSON schema has an object with {optional:,} optional properties; "
                        f"at most {MAX_OPTIONAL_PROPERTIES} are supported (list the others in "
                        "\"required\").")
        elif isinstance(node, list):
            children = node
        else:
            continue
        if children and depth >= MAX_SCHEMA_DEPTH:
            raise GenerationError(f"The JSON schema is nested too deeply (over "
                                  f"{MAX_SCHEMA_DEPTH} levels).")
        todo.extend((c, depth + 1) for c in children)
    if properties > MAX_PROPERTIES:
        raise GenerationError(f"The JSON schema has {properties:,} properties; at most "
                              f"{MAX_PROPERTIES:,} are supported.")


def _first_line(message: str) -> str:
    return (message.strip().splitlines() or ["unknown error"])[0]


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
        check_schema(schema)
    else:
        raise GenerationError(f"response_format type {kind!r} is not supported: use text, "
                              "json_object or json_schema.")
    options = schema.get("x-guidance", {})
    if not isinstance(options, dict):
        raise GenerationError("x-guidance in the JSON schema must be an object of llguidance "
                              "options.")
    # One space after ':' and ',' and none elsewhere: with free whitespace a small model can
    # pad forever (every space is valid JSON); the document is still any valid instance.
    schema = {**schema, "x-guidance": {"whitespace_flexible": False, "key_separator": ": ",
                                       "item_separator": ", ", **options}}
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
        self.error: str | None = None  # why the grammar failed during the reply

    @classmethod
    def for_format(cls, tokenizer, response_format: dict, *, vocab_size: int,
                   eos_ids: Sequence[int]) -> Constraint | None:
        grammar = compile_format(response_format)
        if grammar is None:
            return None
        if not eos_ids:
            raise GenerationError("Structured output needs the model's end-of-sequence token.")
        lt = ll_tokenizer(tokenizer, vocab_size, int(eos_ids[0]))
        return cls.build(lt, grammar, vocab_size=vocab_size, eos=int(eos_ids[0]))

    @classmethod
    def build(cls, lt, grammar: str, *, vocab_size: int, eos: int) -> Constraint:
        """From an llguidance tokenizer (``ll_tokenizer``) and a ``compile_format`` grammar;
        safe on any thread (llguidance drops the GIL while it builds). Checks the first mask
        too: a schema that admits no document fails there, before any token."""
        import llguidance

        matcher = llguidance.LLMatcher(lt, grammar, log_level=0)  # its errors come back here
        if matcher.is_error():
            raise GenerationError(f"The JSON schema cannot be used: "
                                  f"{_first_line(matcher.get_error())}")
        c = cls(matcher, vocab_size, eos)
        c.grammar = grammar  # what another rank of a cluster rebuilds it from
        c._mask()
        if c.error is not None:
            raise GenerationError("The JSON schema cannot be used: no JSON document satisfies "
                                  "it (a $ref that only leads to itself, such as {\"$ref\": "
                                  f"\"#\"}}?); llguidance: {c.error}")
        return c

    def _mask(self) -> np.ndarray:
        words = np.frombuffer(self._m.compute_bitmask(), dtype="<u4")
        if self._m.is_error():
            return self._failed()
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        return bits[: self.vocab_size].astype(bool)

    def _failed(self) -> np.ndarray:
        """The grammar gave up (it never recovers): note why; from now on only EOS."""
        if self.error is None:
            self.error = _first_line(self._m.get_error())
        only = np.zeros(self.vocab_size, dtype=bool)
        only[self.eos] = True
        return only

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
            if not self._m.consume_token(t) and self._m.is_error():
                self._failed()  # a parser limit: the next mask allows only EOS

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
