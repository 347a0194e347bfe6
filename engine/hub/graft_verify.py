"""Prove a conversion's trunk is its source's before fetching the source's MTP head.

Two checks, both before a byte of the head is fetched, each refusing in one line that names
what differs:

1. the text config: family and every shape field (``graft_source.SHAPE_FIELDS``) agree, and
   the source carries ``mtp.*`` tensors;
2. tensors a conversion leaves unquantized and small — the final norm, a layer's input and
   post-attention norms, the attention q/k norms, a Gated DeltaNet layer's ``A_log`` and
   ``dt_bias`` — are read from the source with HTTP Range requests (a few KB) and must be
   bit-identical to the conversion's, allowing only what ``mlx_lm.convert`` does to them
   (the +1 of zero-centred norms, a cast to the conversion's dtype), computed in MLX the way
   mlx-lm computes it.

A fine-tune of the same base, or another model of the same size, has other norms: refused.
"""
from __future__ import annotations

import logging
from pathlib import Path

from engine.models import checkpoint

from engine.hub.graft_source import SHAPE_FIELDS, GraftError, Source

log = logging.getLogger(__name__)

# Suffixes of the tensors compared (mlx-lm shifts the first four when converting raw HF).
SHIFTED = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
           ".k_norm.weight", "model.norm.weight")
COMPARED = SHIFTED + ("linear_attn.A_log", "linear_attn.dt_bias")
MAX_COMPARED_BYTES = 1 << 16   # per tensor
MAX_COMPARED = 6
SOURCE_PREFIXES = ("model.language_model.", "model.", "language_model.model.")
# Where a conversion keeps its trunk: Qwen3.5's nest it under language_model, the
# text-only families (Qwen3-Next, GLM, DeepSeek) write model.*.
CONV_PREFIXES = ("language_model.model.", "model.")


def check_config(folder_config: dict, source: Source) -> None:
    """Family, shapes and the head's presence; raises GraftError naming the first difference."""
    mine = folder_config.get("text_config") if isinstance(folder_config.get("text_config"),
                                                          dict) else folder_config
    theirs = source.text
    fam = (checkpoint.TYPE_FAMILY.get(str(folder_config.get("model_type"))),
           checkpoint.TYPE_FAMILY.get(str(source.config.get("model_type"))))
    if fam[0] != fam[1]:
        raise GraftError(f"refused: the model is {fam[0] or 'not a supported model'}, "
                         f"{source.repo_id} is {fam[1] or 'not a supported model'}; nothing "
                         "was fetched")
    for key in SHAPE_FIELDS:
        a = mine.get(key, folder_config.get(key))
        b = theirs.get(key, source.config.get(key))
        if a is not None and b is not None and a != b:
            raise GraftError(f"refused: the trunk is not {source.repo_id}'s ({key} is {a} here, "
                             f"{b} there); nothing was fetched")
    if not source.head_names:
        raise GraftError(f"refused: {source.repo_id} has no MTP head (no mtp.* tensors or "
                         "nextn layer); nothing was fetched")


def local_tensors(folder: Path) -> dict[str, tuple[Path, dict]]:
    """Every tensor of a local checkpoint with the shard holding it."""
    out = {}
    for shard in checkpoint.shard_files(folder):
        for name, meta in checkpoint.read_header(shard).items():
            out[name] = (shard, meta)
    return out


def pairs(local: dict, source: Source) -> list[tuple[str, str]]:
    """(conversion name, source name) of the small unquantized tensors to compare."""
    out = []
    for name in sorted(local, key=_order):
        prefix = next((p for p in CONV_PREFIXES if name.startswith(p)), None)
        if prefix is None or not name.endswith(COMPARED):
            continue
        base = name[:-len(".weight")] if name.endswith(".weight") else name
        shard, meta = local[name]
        if f"{base}.scales" in local or meta["dtype"] not in ("F32", "F16", "BF16"):
            continue
        rel = name[len(prefix):]
        src = next((p + rel for p in SOURCE_PREFIXES if p + rel in source.tensor_file), None)
        if src is None or source.meta(src)["data_offsets"][1] - \
                source.meta(src)["data_offsets"][0] > MAX_COMPARED_BYTES:
            continue
        out.append((name, src))
        if len(out) >= MAX_COMPARED:
            break
    return out


def _order(name: str) -> tuple[int, str]:
    """Spread the comparison: the final norm, then layer 0, then the rest by name."""
    if name.endswith("model.norm.weight"):
        return 0, name
    return (1 if ".layers.0." in name else 2), name


def _decode(data: bytes, dtype: str, shape: list[int]):
    import mlx.core as mx
    import numpy as np

    if dtype == "BF16":
        bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return mx.array(bits.view(np.float32).reshape(shape)).astype(mx.bfloat16)
    arr = np.frombuffer(data, dtype="<f4" if dtype == "F32" else "<f2").reshape(shape)
    return mx.array(arr)


def _variants(src, target, shifted: bool) -> list:
    import mlx.core as mx

    out = [src.astype(target)]
    if shifted:
        out += [(src + 1.0).astype(target), src.astype(target) + 1.0,
                (src.astype(mx.float32) + 1.0).astype(target)]
    return out


def _same(a, b) -> bool:
    import mlx.core as mx
    import numpy as np

    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)))


def fetch_tensor(source: Source, name: str, token: str | None) -> bytes:
    from engine.hub import client as hub

    shard = source.shards[source.tensor_file[name]]
    a, b = shard.tensors[name]["data_offsets"]
    return hub.fetch_bytes(source.repo_id, shard.path, revision=source.commit, token=token,
                           byte_range=(shard.header_len + a, shard.header_len + b - 1))


def read_local(path: Path, meta: dict) -> bytes:
    import struct

    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        a, b = meta["data_offsets"]
        fh.seek(8 + n + a)
        return fh.read(b - a)


def check_tensors(folder: Path, source: Source, token: str | None) -> int:
    """Compare the small unquantized tensors; returns the bytes fetched to do it."""
    local = local_tensors(folder)
    todo = pairs(local, source)
    if not todo:
        raise GraftError(f"refused: no unquantized trunk tensor of the model can be compared "
                         f"with {source.repo_id}'s, so it cannot be proved to be its trunk")
    from engine.models.families import ZERO_CENTRED

    shifts = checkpoint.TYPE_FAMILY.get(str(source.config.get("model_type"))) in ZERO_CENTRED
    fetched = 0
    for mine, theirs in todo:
        path, meta = local[mine]
        smeta = source.meta(theirs)
        if list(meta["shape"]) != list(smeta["shape"]):
            raise GraftError(f"refused: the trunk is not {source.repo_id}'s ({mine} has shape "
                             f"{meta['shape']} here, {smeta['shape']} there); nothing was fetched")
        data = fetch_tensor(source, theirs, token)
        fetched += len(data)
        here = _decode(read_local(path, meta), meta["dtype"], meta["shape"])
        there = _decode(data, smeta["dtype"], smeta["shape"])
        shifted = shifts and mine.endswith(SHIFTED)  # plain RMSNorms are copied as they are
        if not any(_same(v, here) for v in _variants(there, here.dtype, shifted)):
            import mlx.core as mx

            delta = float(mx.max(mx.abs(here.astype(mx.float32) - there.astype(mx.float32))))
            raise GraftError(f"refused: the trunk is not {source.repo_id}'s ({mine} differs "
                             f"from {theirs}, max |difference| {delta:.3g}); the head was not "
                             "fetched")
    fetched += check_embedding_rows(folder, local, source, token)
    log.info("trunk matches %s on %d tensors", source.repo_id, len(todo))
    return fetched


EMBEDS = tuple(p + "embed_tokens" for p in CONV_PREFIXES)


def _row(path: Path, meta: dict, row: int) -> bytes:
    """Row ``row`` of a local 2-D tensor, read from the file."""
    import struct

    width = (meta["data_offsets"][1] - meta["data_offsets"][0]) // meta["shape"][0]
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        fh.seek(8 + n + meta["data_offsets"][0] + row * width)
        return fh.read(width)


def check_embedding_rows(folder: Path, local: dict, source: Source, token: str | None) -> int:
    """Quantized conversions: two rows of the embedding, dequantized, must agree with the
    source's rows within the quantization's error (at most one step of the row's scale).
    Returns the bytes fetched; skipped when the embedding is not affine-quantized here."""
    import mlx.core as mx

    from engine.models.checkpoint import read_config

    quant = read_config(folder).quantization or {}
    theirs = next((p + "embed_tokens.weight" for p in SOURCE_PREFIXES
                   if p + "embed_tokens.weight" in source.tensor_file), None)
    embed = next((e for e in EMBEDS if f"{e}.weight" in local), EMBEDS[0])
    parts = [local.get(f"{embed}.{k}") for k in ("weight", "scales", "biases")]
    if theirs is None or None in parts or quant.get("mode", "affine") != "affine":
        return 0
    smeta = source.meta(theirs)
    vocab, hidden = smeta["shape"]
    bits, group = int(quant.get("bits", 4)), int(quant.get("group_size", 64))
    shard = source.shards[source.tensor_file[theirs]]
    per_row = (smeta["data_offsets"][1] - smeta["data_offsets"][0]) // vocab
    fetched = 0
    for row in (1, vocab // 2):
        from engine.hub import client as hub

        start = shard.header_len + smeta["data_offsets"][0] + row * per_row
        data = hub.fetch_bytes(source.repo_id, shard.path, revision=source.commit, token=token,
                               byte_range=(start, start + per_row - 1))
        fetched += len(data)
        there = _decode(data, smeta["dtype"], [1, hidden]).astype(mx.float32)
        w, sc, b = (_decode_any(_row(p, m, row), m) for p, m in parts)
        here = mx.dequantize(w, sc, b, group_size=group, bits=bits).astype(mx.float32)
        step = mx.repeat(mx.abs(sc.astype(mx.float32)), group, axis=-1)
        worst = float(mx.max(mx.abs(here - there) - step))
        if here.shape != there.shape or worst > 1e-6:
            raise GraftError(f"refused: the trunk is not {source.repo_id}'s (row {row} of "
                             "embed_tokens differs beyond the quantization's error); the head "
                             "was not fetched")
    return fetched


def _decode_any(data: bytes, meta: dict):
    """One row of a local tensor (packed uint32 weights, or float scales / biases)."""
    import mlx.core as mx
    import numpy as np

    width = meta["shape"][1]
    if meta["dtype"] == "U32":
        return mx.array(np.frombuffer(data, dtype="<u4").reshape(1, width))
    return _decode(data, meta["dtype"], [1, width])
