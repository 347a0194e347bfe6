"""Drawing one token exactly as plain decoding draws it, and the random keys a reply uses.

``pick`` is the draw on the device (lazy); ``draw`` the same on the host (one sync), with a
structured-output mask; ``keys(seed)`` the reply's keys in their fixed order; ``cut`` ends a
reply's tokens (EOS, budget) and advances its grammar. Every decode path (a prompt's first
token, a depth-0 row, a speculative row's acceptance) draws through these, so a seeded reply
gives the same tokens alone or in a batch.
"""
from __future__ import annotations

import functools
import random
from collections.abc import Iterator

import mlx.core as mx

from engine.decoding.reply import Reply
from engine.sampling import candidates, exact as sampling, grammar
from engine.sampling.grammar import Constraint
from engine.types import FinishReason, SamplingParams


def pick(logits: mx.array, params: SamplingParams, counts, key, *,
         dense: bool = False) -> tuple[mx.array, mx.array | None]:
    """The next token from logits [1, V] exactly as plain decoding samples it, and, when the
    compact top-k sampler drew it, its ``exact`` flag [1] (False: redo with ``dense``)."""
    c = None if counts is None else counts[None]
    if params.greedy:
        return sampling.argmax_tokens(logits, params, c)[0], None
    compact = not dense and candidates.applies(params, logits.shape[-1], logits.dtype)
    fn = _compiled_draw(params, compact, c is not None)
    out = fn(logits, key) if c is None else fn(logits, key, c)
    return out[0], (out[1] if compact else None)


def _draw_ops(params: SamplingParams, compact: bool):
    """``pick``'s non-greedy draw as MLX operations (logits, key, counts) -> (y[1], ...)."""
    if compact:
        def ops(logits, key, c):
            cand = candidates.build(logits, params, c)
            return candidates.sample(cand, key), cand.exact
        return ops
    return lambda logits, key, c: (sampling.sample(sampling.build_probs(logits, params, c),
                                                   key),)


@functools.lru_cache(maxsize=64)
def _compiled_draw(params: SamplingParams, compact: bool, penalised: bool):
    """``_draw_ops`` compiled (``mx.compile``), once per parameter set: the same operations,
    fused, so the same tokens, probabilities and ``exact`` flags bit for bit (tested), without
    the per-operation dispatch of ~60 small ops a token that made depth 0 ~0.8x mlx-lm
    (whose sampler is compiled) at temperature > 0."""
    ops = _draw_ops(params, compact)
    return mx.compile(ops if penalised else (lambda logits, key: ops(logits, key, None)))


def draw(logits: mx.array, params: SamplingParams, counts, key,
         constraint: Constraint | None) -> int:
    """One token on the host, exactly as plain decoding draws it (one sync)."""
    if constraint is not None:
        logits = grammar.masked(logits, constraint.allowed())
    y, exact = pick(logits, params, counts, key)
    if exact is not None and not exact.item():
        y, _ = pick(logits, params, counts, key, dense=True)
    return int(y.item())


def cut(reply: Reply, tokens: list[int],
        constraint: Constraint | None) -> tuple[list[int], FinishReason | None]:
    """``reply.cut(tokens)``, the grammar advanced over what is kept."""
    tokens, reason = reply.cut(tokens)
    if constraint is not None:
        constraint.advance(tokens)
    return tokens, reason


def keys(seed: int | None) -> Iterator[mx.array]:
    """A reply's random keys, one per use, in a fixed order (a random seed when None)."""
    k = sampling.make_key(seed if seed is not None else random.getrandbits(62))
    while True:
        k, sub = _split_key(k)
        yield sub


@mx.compile
def _split_key(k: mx.array) -> tuple[mx.array, mx.array]:
    """``sampling.split_key(k, 2)`` compiled (integer ops: the same keys)."""
    a, b = sampling.split_key(k, 2)
    return a, b
