"""Synthetic checkpoints in the MTP-carrying layouts other projects publish.

- :func:`write_mlxlm_mtp`: what ``mlx_lm.convert`` writes with mlx-lm's open MTP pull request
  (ml-explore/mlx-lm#1226, "Add native MTP support for Qwen 3.5/3.6"): MLX layout (conv1d
  transposed, norms already 1 + w), the head kept under ``language_model.mtp.*`` inside the
  ordinary shards, and with ``bits`` the WHOLE head quantized like the trunk (``mtp.fc``
  included), which is what collapses acceptance in their reports.
- :func:`write_mtplx_pack`: an MTPLX model pack (youssofal/MTPLX): an MLX 4-bit trunk whose
  index names only trunk tensors, the head byte-copied from Qwen's checkpoint into a separate
  ``mtp.safetensors`` (``mtp.*`` keys, zero-centred norms, declared by
  ``config.json: mlx_lm_extra_tensors.mtp_file`` and ``mtplx_runtime.json: mtp_norm_layout =
  raw_hf_delta``); with ``prequantized`` the head's linear layers are MLX affine-quantized
  (``mtplx_mtp_quantization: {prequantized, bits, group_size, mode}``) and ``mtp.fc`` stays
  unquantized, as MTPLX's default policy writes it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _copy_tokenizer(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for n in TOKENIZER:
        if (src / n).is_file():
            shutil.copy2(src / n, out / n)


def _flat(module, prefix: str = "") -> dict:
    from mlx.utils import tree_flatten

    return {prefix + k: v for k, v in tree_flatten(module.parameters())}


def write_mlxlm_mtp(src: Path, out: Path, *, bits: int | None = None,
                    group_size: int = 32) -> Path:
    import mlx.core as mx
    import mlx.nn as nn

    import engine

    m = engine.load(src)
    config = json.loads((src / "config.json").read_text())
    if bits:
        for mod in (m.trunk, m.mtp):
            nn.quantize(mod, group_size=group_size, bits=bits,
                        class_predicate=lambda p, x: hasattr(x, "to_quantized")
                        and x.weight.shape[-1] % group_size == 0)
        config["quantization"] = config["quantization_config"] = {"group_size": group_size,
                                                                  "bits": bits}
    weights = {**_flat(m.trunk), **_flat(m.mtp, "language_model.mtp.")}
    _copy_tokenizer(src, out)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def _raw_mtp(src: Path) -> dict:
    import mlx.core as mx

    raw = {}
    for f in sorted(src.glob("*.safetensors")):
        raw.update({k: v for k, v in mx.load(str(f)).items() if k.startswith("mtp.")})
    return raw


def _prequantize(head: dict, bits: int, group_size: int) -> dict:
    import mlx.core as mx

    out = {}
    for k, v in head.items():
        if v.ndim == 2 and k.startswith("mtp.layers.") and k.endswith("_proj.weight") \
                and v.shape[-1] % group_size == 0:
            w, s, b = mx.quantize(v, group_size=group_size, bits=bits)
            base = k[: -len(".weight")]
            out.update({k: w, f"{base}.scales": s, f"{base}.biases": b})
        else:
            out[k] = v
    return out


def write_mtplx_pack(src: Path, out: Path, *, prequantized: bool = False, bits: int = 4,
                     group_size: int = 32) -> Path:
    import mlx.core as mx

    from engine.models.convert import convert

    tmp = out.parent / f".{out.name}-trunk"
    convert(src, tmp, bits=4, group_size=group_size)
    trunk = {}
    for f in sorted(tmp.glob("*.safetensors")):
        trunk.update({k: v for k, v in mx.load(str(f)).items() if not k.startswith("mtp.")})
    config = json.loads((tmp / "config.json").read_text())
    config["quantization"] = {"group_size": group_size, "bits": 4}
    config["mlx_lm_extra_tensors"] = {"mtp_file": "mtp.safetensors"}
    head = _raw_mtp(src)  # byte-preserved from Qwen's layout: zero-centred norms
    if prequantized:
        head = _prequantize(head, bits, group_size)
        config["mtplx_mtp_quantization"] = {"prequantized": True, "bits": bits,
                                            "group_size": group_size, "mode": "affine"}
    _copy_tokenizer(src, out)
    shard = "model-00001-of-00001.safetensors"
    mx.save_safetensors(str(out / shard), trunk, metadata={"format": "mlx"})
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for k in trunk}}))
    mx.save_safetensors(str(out / "mtp.safetensors"), head, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "mtplx_runtime.json").write_text(json.dumps(
        {"schema_version": "mtplx.runtime.v1", "mtp_depth_max": 3,
         "mtp_norm_layout": "raw_hf_delta"}))
    shutil.rmtree(tmp)
    return out


def write_mlxvlm_drafter(src: Path, out: Path, *, bits: int | None = None,
                         group_size: int = 64) -> Path:
    """What mlx-vlm's ``split_mtp`` (``MTPSplitter.split`` with ``Qwen3_5MTPSplitter``) writes
    from a raw Qwen3.5 checkpoint: ``model.safetensors`` with the ``mtp.`` prefix dropped, the
    zero-centred norms shifted (+1, ``Qwen3_5MTPDraftModel.sanitize``), fused experts split into
    ``switch_mlp`` (per-expert ones kept), quantized with ``bits`` (every ``*.weight`` matrix but
    the router ``mlp.gate``), ``config.json`` with ``model_type: qwen3_5_mtp`` and the source's
    ``text_config``, and the tokenizer files."""
    import mlx.core as mx

    norms = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
             ".k_norm.weight", "norm.weight", "pre_fc_norm_embedding.weight",
             "pre_fc_norm_hidden.weight")
    weights = {}
    for key, value in _raw_mtp(src).items():
        key = key[len("mtp."):]
        if key.endswith(norms) and value.ndim == 1:
            value = value + 1.0
        weights[key] = value
    config = json.loads((src / "config.json").read_text())
    text = config.get("text_config", config)
    draft = {"model_type": "qwen3_5_mtp", "text_config": text,
             "block_size": int(text.get("mtp_num_hidden_layers", 1)) + 2,
             "tie_word_embeddings": bool(text.get("tie_word_embeddings", True))}
    if bits:
        for key in [k for k in weights if k.endswith(".weight") and
                    not k.endswith("mlp.gate.weight")]:
            v = weights[key]
            if v.ndim >= 2 and v.shape[-1] % group_size == 0:
                w, s, b = mx.quantize(v, group_size=group_size, bits=bits)
                base = key[: -len(".weight")]
                weights.update({key: w, f"{base}.scales": s, f"{base}.biases": b})
        draft["quantization"] = draft["quantization_config"] = {
            "group_size": group_size, "bits": bits, "mode": "affine"}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(dict(sorted(draft.items())), indent=2))
    for n in ("tokenizer.json", "tokenizer_config.json"):
        if (src / n).is_file():
            shutil.copy2(src / n, out / n)
    return out


def write_mlx_with_head(src: Path, out: Path) -> Path:
    """An MLX conversion that keeps the head (mlx-vlm's MLX-source case, this engine's own
    ``convert``): ``language_model.model.*`` trunk with shifted norms, ``mtp.*`` beside it with
    shifted norms, ``vision_tower.*`` kept, all in one ``format: mlx`` file."""
    import mlx.core as mx

    import engine

    m = engine.load(src)
    weights = {**_flat(m.trunk), **_flat(m.mtp, "mtp.")}
    weights["vision_tower.patch_embed.proj.weight"] = mx.zeros((8, 3))
    _copy_tokenizer(src, out)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text((src / "config.json").read_text())
    return out


def write_glm4_moe_lite_drafter(src: Path, out: Path, *, bits: int | None = None,
                                group_size: int = 64) -> Path:
    """What mlx-vlm's ``glm4_moe_lite_mtp/split.py`` (``split_glm4_moe_lite_mtp``) writes from
    a raw GLM-4.7-Flash checkpoint: the nextn layer ``model.layers.{N}.*`` flattened
    (``model.embed_tokens``, ``model.{enorm,hnorm,eh_proj}``, ``model.mtp_block.*``,
    ``model.shared_head_norm``, ``lm_head``), cast to bf16 but the router's fp32 correction
    bias, ``kv_b_proj`` split into ``embed_q`` / ``unembed_out``, experts stacked into
    ``switch_mlp``, optionally affine-quantized (every ``*.weight`` matrix whose last axis the
    group divides, but the router ``mlp.gate``); ``config.json`` with ``model_type:
    glm4_moe_lite_mtp``, the source's text config, ``block_size``; the tokenizer files."""
    import mlx.core as mx
    from safetensors.numpy import load_file

    config = json.loads((src / "config.json").read_text())
    n = config["num_hidden_layers"]
    prefix = f"model.layers.{n}."
    raw = {}
    for f in sorted(src.glob("*.safetensors")):
        raw.update({k: v for k, v in load_file(str(f)).items() if k.startswith(prefix)})
    top = {"embed_tokens.weight": "model.embed_tokens.weight",
           "shared_head.norm.weight": "model.shared_head_norm.weight",
           "shared_head.head.weight": "lm_head.weight"}
    w = {}
    for k, v in raw.items():
        rest = k[len(prefix):]
        name = top.get(rest) or (f"model.{rest}" if rest in ("enorm.weight", "hnorm.weight",
                                                             "eh_proj.weight")
                                 else f"model.mtp_block.{rest}")
        a = mx.array(v)
        w[name] = a if "e_score_correction_bias" in name else a.astype(mx.bfloat16)
    attn = "model.mtp_block.self_attn"
    kv = w.pop(f"{attn}.kv_b_proj.weight").reshape(
        config["num_attention_heads"], config["qk_nope_head_dim"] + config["v_head_dim"], -1)
    w[f"{attn}.embed_q.weight"] = mx.contiguous(
        kv[:, :config["qk_nope_head_dim"], :].swapaxes(-1, -2))
    w[f"{attn}.unembed_out.weight"] = mx.contiguous(kv[:, config["qk_nope_head_dim"]:, :])
    mlp = "model.mtp_block.mlp"
    for proj in ("gate_proj", "down_proj", "up_proj"):
        w[f"{mlp}.switch_mlp.{proj}.weight"] = mx.stack(
            [w.pop(f"{mlp}.experts.{e}.{proj}.weight")
             for e in range(config["n_routed_experts"])])
    draft = {"model_type": "glm4_moe_lite_mtp", "text_config": config,
             "block_size": int(config.get("num_nextn_predict_layers", 1)) + 1,
             "tie_word_embeddings": bool(config.get("tie_word_embeddings", False))}
    if bits:
        for key in [k for k in w if k.endswith(".weight") and not k.endswith("mlp.gate.weight")]:
            v = w[key]
            if v.ndim >= 2 and v.shape[-1] % group_size == 0:
                q, s, b = mx.quantize(v, group_size=group_size, bits=bits)
                base = key[: -len(".weight")]
                w.update({key: q, f"{base}.scales": s, f"{base}.biases": b})
        draft["quantization"] = draft["quantization_config"] = {
            "group_size": group_size, "bits": bits, "mode": "affine"}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), w, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(dict(sorted(draft.items())), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    return out
