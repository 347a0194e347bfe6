"""An MTP head from an mlx-vlm drafter folder on disk (``graft MODEL --from FOLDER``).

mlx-vlm's ``split_mtp`` / ``convert --mtp`` write a Qwen3.5/3.6 MTP head as a standalone
"drafter" folder (mlx_vlm/speculative/drafters/qwen3_5_mtp, ``mtp_split.MTPSplitter``):

- ``config.json``: ``model_type: "qwen3_5_mtp"``, the source's ``text_config``, ``block_size``,
  ``tie_word_embeddings`` and, when the head is quantized, ``quantization`` (MLX affine);
- ``model.safetensors``: the head's tensors without the ``mtp.`` prefix; from a raw source
  the norms are shifted (1 + w) and fused MoE experts split into ``switch_mlp``; from an MLX
  source the tensors are copied as they were;
- the source's tokenizer files.

Nothing is downloaded. The drafter has no trunk to compare, so the match rests on its
text config (every shape field must agree) and on the calibration's acceptance. The head
is kept at 8 bits or more (a drafter quantized below that is used as published, and says so).

mlx-vlm's ``glm4_moe_lite_mtp`` splitter (``drafters/glm4_moe_lite_mtp/split.py``) writes
GLM-4.7-Flash's nextn layer the same way, flattened: ``model.{enorm,hnorm,eh_proj}``,
``model.mtp_block.*`` (the decoder layer after mlx-lm's sanitize: experts stacked, MLA's
``kv_b_proj`` split into ``embed_q`` / ``unembed_out``), ``model.shared_head_norm``, and copies
of the embedding (``model.embed_tokens``) and LM head (``lm_head``); bf16, or affine-quantized
with the router gate and norms left as they were. ``write_from_nextn_drafter`` renames it back
to the nextn layer ``model.layers.{num_hidden_layers}.*`` (copies dropped: the trunk's are used)
and keeps its bytes and packing as published.
"""
from __future__ import annotations

import logging
from pathlib import Path

from engine.errors import ModelLoadError
from engine.hub.graft_source import SHAPE_FIELDS, GraftError
from engine.models import checkpoint

log = logging.getLogger(__name__)

DRAFTER_TYPE = "qwen3_5_mtp"
# mlx-vlm drafter model_type -> the family whose conversion it attaches to (beside Qwen3.5's).
NEXTN_DRAFTERS = {"glm4_moe_lite_mtp": "glm4_moe_lite"}
NEXTN_COPIES = ("model.embed_tokens.", "lm_head.")  # (quantized: .weight, .scales, .biases)
NORM_SUFFIXES = ("norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")


def is_drafter(folder: Path) -> bool:
    try:
        raw = checkpoint.read_json(folder / "config.json", "config.json")
    except ModelLoadError:
        return False
    return raw.get("model_type") == DRAFTER_TYPE or raw.get("model_type") in NEXTN_DRAFTERS


def sibling_drafter(model: Path) -> Path | None:
    """mlx-vlm's ``convert --mtp`` writes the drafter beside the conversion as ``<it>-mtp``."""
    cand = model.with_name(model.name + "-mtp")
    return cand if cand.is_dir() and is_drafter(cand) else None


def check_drafter(folder: Path, model_config: dict) -> dict:
    """The drafter's config, after checking it belongs to this model's shape."""
    raw = checkpoint.read_json(folder / "config.json", "config.json")
    family = checkpoint.TYPE_FAMILY.get(str(model_config.get("model_type")))
    want = next((t for t, f in NEXTN_DRAFTERS.items() if f == family), None)
    if want is not None and raw.get("model_type") != want:
        raise GraftError(f"refused: {folder} is not an mlx-vlm {family} MTP drafter "
                         f"(model_type {raw.get('model_type')!r}, expected {want!r})")
    if want is None and raw.get("model_type") != DRAFTER_TYPE:
        raise GraftError(f"refused: {folder} is not an mlx-vlm Qwen3.5 MTP drafter "
                         f"(model_type {raw.get('model_type')!r}, expected {DRAFTER_TYPE!r})")
    theirs = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    mine = model_config.get("text_config") if isinstance(model_config.get("text_config"),
                                                         dict) else model_config
    for key in SHAPE_FIELDS:
        a, b = mine.get(key), theirs.get(key)
        if a is not None and b is not None and a != b:
            raise GraftError(f"refused: the drafter {folder.name} is for another model ({key} "
                             f"is {a} here, {b} there)")
    return raw


def _norms_shifted(weights: dict) -> bool:
    """Shifted norms (1 + w) sit around 1, zero-centred ones around 0."""
    import mlx.core as mx

    vals = [mx.mean(mx.abs(v.astype(mx.float32))).item() for k, v in weights.items()
            if k.endswith(NORM_SUFFIXES) and v.ndim == 1]
    return bool(vals) and sorted(vals)[len(vals) // 2] > 0.5


def stack_experts(weights: dict) -> dict:
    """``….experts.N.{gate,up,down}_proj.{weight,scales,biases}`` -> stacked ``switch_mlp``."""
    import re

    import mlx.core as mx

    pattern = re.compile(r"(.*)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\."
                         r"(weight|scales|biases)$")
    groups: dict[tuple[str, str, str], dict[int, object]] = {}
    out = {}
    for key, value in weights.items():
        m = pattern.fullmatch(key)
        if m:
            groups.setdefault((m.group(1), m.group(3), m.group(4)), {})[int(m.group(2))] = value
        else:
            out[key] = value
    for (prefix, proj, suffix), per in groups.items():
        if sorted(per) != list(range(len(per))):
            raise GraftError(f"refused: the drafter's experts under {prefix} are not numbered "
                             "0..N-1")
        out[f"{prefix}.switch_mlp.{proj}.{suffix}"] = mx.stack([per[e] for e in sorted(per)])
    return out


def write_from_drafter(folder: Path, out: Path, *, bits: int, group_size: int, dtype: str,
                       quant: dict | None) -> tuple[str, dict | None]:
    """Write the sidecar from the drafter's tensors; returns (norm encoding, head packing)."""
    import mlx.core as mx

    files = checkpoint.shard_files(folder)
    weights: dict = {}
    for f in files:
        weights.update(mx.load(str(f)))
    if not weights:
        raise GraftError(f"refused: the drafter {folder.name} holds no tensors")
    weights = stack_experts({(k[len("mtp."):] if k.startswith("mtp.") else k): v
                             for k, v in weights.items()})
    encoding = "mlx_multiplier" if _norms_shifted(weights) else "raw_hf_delta"
    packed = quant if any(k.endswith(".scales") for k in weights) else None
    target = getattr(mx, dtype)
    out_w = {}
    for name, v in weights.items():
        if packed is None and mx.issubdtype(v.dtype, mx.floating):
            v = v.astype(target)
        if packed is None and bits < 16 and name.endswith(".weight") and v.ndim >= 2 \
                and v.shape[-1] % group_size == 0:
            w, s, b = mx.quantize(v, group_size=group_size, bits=bits)
            base = name[: -len(".weight")]
            out_w.update({f"mtp.{base}.weight": w, f"mtp.{base}.scales": s,
                          f"mtp.{base}.biases": b})
            continue
        out_w[f"mtp.{name}"] = v
    if packed is None and bits < 16:
        packed = {"bits": bits, "group_size": group_size}
    mx.eval(out_w)
    tmp = out.with_name(out.name + ".tmp.safetensors")
    mx.save_safetensors(str(tmp), out_w, metadata={"format": "mlx"})
    tmp.replace(out)
    if packed is not None and int(packed.get("bits", 8)) < 8:
        log.warning("the drafter's head is %s-bit: used as published", packed.get("bits"))
    return encoding, packed


def write_from_nextn_drafter(folder: Path, out: Path, *, layer: int, quant: dict | None,
                             ) -> dict | None:
    """Write the sidecar from a flattened nextn drafter (``NEXTN_DRAFTERS``): its tensors
    renamed to ``model.layers.{layer}.*`` as published (bytes and packing kept), the copies of
    the embedding and LM head dropped. Returns the head's packing (None: not quantized)."""
    import mlx.core as mx

    weights: dict = {}
    for f in checkpoint.shard_files(folder):
        weights.update(mx.load(str(f)))
    prefix = f"model.layers.{layer}."
    out_w = {}
    for name, v in weights.items():
        if name.startswith(NEXTN_COPIES) or name.endswith("rotary_emb.inv_freq"):
            continue
        if name.startswith("model.mtp_block."):
            out_w[prefix + name[len("model.mtp_block."):]] = v
        elif name.startswith("model.shared_head_norm."):
            out_w[prefix + "shared_head.norm." + name[len("model.shared_head_norm."):]] = v
        elif name.startswith(("model.enorm.", "model.hnorm.", "model.eh_proj.")):
            out_w[prefix + name[len("model."):]] = v
        else:
            raise GraftError(f"refused: the drafter {folder.name} holds {name}, which is not "
                             "part of an mlx-vlm nextn drafter")
    if not out_w:
        raise GraftError(f"refused: the drafter {folder.name} holds no nextn layer tensors")
    tmp = out.with_name(out.name + ".tmp.safetensors")
    mx.save_safetensors(str(tmp), out_w, metadata={"format": "mlx"})
    tmp.replace(out)
    packed = quant if any(k.endswith(".scales") for k in out_w) else None
    if packed is not None and int(packed.get("bits", 8)) < 8:
        log.warning("the drafter's head is %s-bit: used as published", packed.get("bits"))
    return packed
