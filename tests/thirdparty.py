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
