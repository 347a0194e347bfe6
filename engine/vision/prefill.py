"""A prompt span holding images, fed to a ``Session``: the images encoded, their embeddings in
place of the image pads, the trunk and the MTP head run at M-RoPE positions.

``prefill_chunks(session, tokens, images)`` is ``Session.prefill_chunks`` for a span with
images (the session calls it when one of the prompt's images lies in the span): the same
chunks, the same invariants (MTP_SPEC §3: ``fed``, ``last_hidden``, one MTP row per committed
pair), with three differences:
- the input of an image pad is the encoder's embedding of that image token, for the trunk and
  for the MTP head's pair whose next token is that pad (what vLLM feeds its MTP layer);
- attention rotates at the span's 3-D positions (``engine.vision.positions``), the trunk's
  and the head's (a pair (h_t, x_{t+1}) at t's position, as for text);
- after the span, the session's ``rope_delta`` (and every attention cache's) is where text
  continues, so every later step (plain, verify rows, MTP drafts) adds it to its offset.
The span's images are recorded in ``session.media`` (start, tokens, digest): the prompt cache
and the disk cache match a snapshot only when its media equal the prompt's.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import mlx.core as mx
import numpy as np
from mlx_lm.models.base import (create_attention_mask, create_ssm_mask,
                                scaled_dot_product_attention)

from engine.models import trunk as trunk_ops
from engine.vision.positions import MRoPE, prompt_positions


def encode(model, images: list) -> list[mx.array]:
    """Each placed image's embeddings [tokens, hidden] (preprocessed, then one encoder call
    for all of them). Counts ``model.vision_stats`` (calls, seconds per phase)."""
    from engine.vision.preprocess import prepare

    stats = model.vision_stats
    t0 = time.perf_counter()
    prepared = [prepare(p.image.pixels, model.image_config) for p in images]
    t1 = time.perf_counter()
    for p, prep in zip(images, prepared):
        if prep.tokens != p.tokens:
            raise ValueError(f"image at token {p.start}: {p.tokens} pads for {prep.tokens} "
                             "image tokens (render the prompt with Model.chat_prompt)")
    patches = mx.array(np.concatenate([p.patches for p in prepared]))
    out = model.vision(patches, [p.grid for p in prepared])
    out = out.astype(model.embed(mx.array([[0]])).dtype)
    mx.eval(out)
    t2 = time.perf_counter()
    stats["calls"] += 1
    stats["images"] += len(images)
    stats["preprocess_s"] += t1 - t0
    stats["encoder_s"] += t2 - t1
    parts, start = [], 0
    for p in prepared:
        parts.append(out[start:start + p.tokens])
        start += p.tokens
    return parts


def _rope(model) -> MRoPE:
    got = model.__dict__.get("_mrope")
    if got is None:
        tm = model.text_model
        attn = next(layer.self_attn for layer in tm.model.layers if not layer.is_linear)
        got = model.__dict__["_mrope"] = MRoPE.for_attention(attn, tm.args)
    return got


def attention_at(layer, x: mx.array, mask, cache, rope: MRoPE, cos, sin) -> mx.array:
    """A gated full-attention decoder layer (mlx-lm's Qwen3.5 operations) rotating at explicit
    positions (``cos``/``sin`` from ``MRoPE.tables``)."""
    attn = layer.self_attn
    q, k, v, gate = trunk_ops.attention_inputs(layer, x)
    q, k = rope.apply(q, cos, sin), rope.apply(k, cos, sin)
    k, v = cache.update_and_fetch(k, v)
    out = scaled_dot_product_attention(q, k, v, cache=cache, scale=attn.scale, mask=mask)
    return trunk_ops.attention_out(layer, out, gate, x)


def trunk_at(model, embeds: mx.array, positions, cache: list) -> mx.array:
    """The trunk over input embeddings [1, S, H] at positions [3, S]; hidden after the norm."""
    inner = model.text_model.model
    rope = _rope(model)
    cos, sin = rope.tables(positions)
    x = embeds
    fa_mask = None if inner.fa_idx is None else create_attention_mask(x, cache[inner.fa_idx])
    ssm_mask = None if inner.ssm_idx is None else create_ssm_mask(x, cache[inner.ssm_idx])
    for layer, c in zip(inner.layers, cache):
        if layer.is_linear:
            x = layer(x, mask=ssm_mask, cache=c)
        else:
            x = attention_at(layer, x, fa_mask, c, rope, cos, sin)
    return inner.norm(x)


def head_at(model, hidden: mx.array, embeds: mx.array, positions, cache: list) -> mx.array:
    """The MTP head over pairs (trunk hidden, next input embedding) at positions [3, S]."""
    mtp = model.mtp
    rope = _rope(model)
    cos, sin = rope.tables(positions)
    z = mtp.fc(mx.concatenate([mtp.pre_fc_norm_embedding(embeds),
                               mtp.pre_fc_norm_hidden(hidden)], axis=-1))
    mask = create_attention_mask(z, cache[0])
    for layer, c in zip(mtp.layers, cache):
        z = attention_at(layer, z, mask, c, rope, cos, sin)
    return mtp.norm(z)


def span_images(session, tokens: list[int], images) -> list:
    """The placed images inside the span ``tokens`` fed after ``session.fed`` (an image cut by
    the span's ends is a ValueError: snapshots never end inside one)."""
    base, end = len(session.fed), len(session.fed) + len(tokens)
    inside = []
    for p in images:
        if p.start + p.tokens <= base or p.start >= end:
            continue
        if p.start < base or p.start + p.tokens > end:
            raise ValueError(f"the image at token {p.start} is cut by the prompt span "
                             f"[{base}, {end})")
        inside.append(p)
    return inside


def prefill_chunks(session, tokens: list[int], images, chunk: int) -> Iterator[int]:
    """See the module docstring; ``chunk`` tokens at a time (the session's prefill chunk);
    yields the tokens fed so far after each chunk."""
    model = session.model
    base = len(session.fed)
    start_pos = base + session.rope_delta
    merge = model.image_config.merge_size
    embeds_img = encode(model, images) if images else []
    spans = []
    for p, emb in zip(images, embeds_img):
        t, gh, gw = p.grid
        spans.append((p.start - base, t, gh // merge, gw // merge))
    positions, shift = prompt_positions(len(tokens), spans, start_pos)
    embeds = _spliced(model, tokens, [(p.start - base, e) for p, e in zip(images, embeds_img)])
    if session.use_mtp:
        session.flush_pending()  # earlier text pairs, at their own positions
    for i in range(0, len(tokens), chunk):
        j = min(len(tokens), i + chunk)
        h = trunk_at(model, embeds[:, i:j], positions[:, i:j], session.trunk_cache)
        if session.use_mtp and session.mtp_cache is not None:
            _head_pairs(session, h, embeds, positions, i, j, start_pos)
        session.last_hidden = h[:, -1:]
        session.fed.extend(tokens[i:j])
        if j < len(tokens):
            mx.eval([c.state for c in session.trunk_cache] + [session.last_hidden])
        else:  # before the last yield: a caller may stop there (``Admission.step``)
            session.last_logits = model.lm_head(session.last_hidden[:, -1])
            session.set_rope_delta(session.rope_delta + shift)
            session.media = tuple(session.media) + tuple(p.key for p in images)
        yield j


def _head_pairs(session, h, embeds, positions, i: int, j: int, start_pos: int) -> None:
    """The committed pairs of chunk [i, j) into the MTP cache: (h_{t-1}, x_t) for each t in
    the chunk, at t-1's position (the first token of a fresh session has no pair)."""
    hs = [h[:, :-1]] if j - i > 1 else []
    first = i
    if session.last_hidden is not None:
        hs.insert(0, session.last_hidden)
    else:
        first = i + 1
    if first >= j:
        return
    hidden = mx.concatenate(hs, axis=1) if len(hs) > 1 else hs[0]
    if first == 0:  # the token before the span is text: its three ids are equal
        prev = np.concatenate([np.full((3, 1), start_pos - 1), positions[:, :j - 1]], axis=1)
    else:
        prev = positions[:, first - 1:j - 1]
    head_at(session.model, hidden, embeds[:, first:j], prev, session.mtp_cache)
    session.mtp_rows += j - first


def _spliced(model, tokens: list[int], parts: list[tuple[int, mx.array]]) -> mx.array:
    """The span's input embeddings [1, S, H]: token embeddings, image pads replaced."""
    segs, at = [], 0
    for first, emb in sorted(parts, key=lambda p: p[0]):
        if first > at:
            segs.append(model.embed(mx.array(tokens[at:first])[None])[0])
        segs.append(emb)
        at = first + emb.shape[0]
    if at < len(tokens):
        segs.append(model.embed(mx.array(tokens[at:])[None])[0])
    return (segs[0] if len(segs) == 1 else mx.concatenate(segs))[None]
