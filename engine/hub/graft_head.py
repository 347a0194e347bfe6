"""Turn a fetched MTP head into a sidecar the loader reads, and measure how well it drafts.

The sidecar (``SIDECAR``) holds the head under ``mtp.*`` with the source's zero-centred norms;
the model's ``config.json`` declares it the way MTPLX packs do (``mlx_lm_extra_tensors.mtp_file``,
``mtp_norm_encoding: raw_hf_delta`` and, when quantized, ``mtplx_mtp_quantization``), so
``engine.models.checkpoint`` / ``build`` load it with no graft-specific code, and the file is
ignored until the config names it (written last, atomically).

Precision (the rule ``convert`` follows, MTP_SPEC §2): ``bits=8`` quantizes the head's linear
layers to 8 bits (affine, the conversion's group size) with its other tensors in the trunk's
float dtype; ``bits=16`` keeps the source's tensors byte for byte. Never below 8 bits.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

log = logging.getLogger(__name__)

SIDECAR = "mtp-graft.safetensors"
HEAD_BITS = (8, 16)
CALIBRATION = (
    "What does os.path.join do?",
    "What does json.dumps do?",
    "Write a Python function that returns the reverse of a string.",
    "Explain in two sentences what a hash table is.",
)
CALIBRATION_DEPTH = 3
CALIBRATION_TOKENS = 32


def trunk_float_dtype(tensors: dict) -> str:
    """The conversion's float dtype (of its norms): the head's floats are cast to it."""
    for name, meta in tensors.items():
        if name.endswith("norm.weight") and meta["dtype"] in ("F32", "F16", "BF16"):
            return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[meta["dtype"]]
    return "bfloat16"


def write_sidecar(raw: Path, out: Path, *, bits: int, group_size: int, dtype: str) -> int:
    """Write the head from ``raw`` (the fetched tensors) to ``out``; returns its size."""
    import mlx.core as mx

    from engine.models.mtp import sanitize_mtp

    if bits == 16:
        import os

        os.replace(raw, out)
        return out.stat().st_size
    target = getattr(mx, dtype)
    head = sanitize_mtp(mx.load(str(raw)), shift_norms=False)
    weights = {}
    for name, v in head.items():
        if mx.issubdtype(v.dtype, mx.floating):
            v = v.astype(target)
        if name.endswith(".weight") and v.ndim >= 2 and v.shape[-1] % group_size == 0:
            w, s, b = mx.quantize(v, group_size=group_size, bits=bits)
            base = name[: -len(".weight")]
            weights.update({f"mtp.{name}": w, f"mtp.{base}.scales": s, f"mtp.{base}.biases": b})
        else:
            weights[f"mtp.{name}"] = v
    mx.eval(weights)
    tmp = out.with_name(out.name + ".tmp.safetensors")
    mx.save_safetensors(str(tmp), weights, metadata={"format": "mlx"})
    tmp.replace(out)
    return out.stat().st_size


def write_nextn_sidecar(raw: Path, out: Path, *, bits: int, group_size: int,
                        dtype: str) -> int:
    """A nextn layer (``model.layers.{N}.*``, names as the source stores them) written with its
    projection matrices at ``bits`` (affine, ``group_size``) and its other floats in the
    trunk's dtype; the loader renames and stacks them as it does a raw layer (mlx-lm's
    sanitize stacks per-expert ``weight`` / ``scales`` / ``biases`` alike). Left as they are:
    the router (``mlp.gate``: not a Linear in mlx-lm) and its correction bias, MLA's
    ``kv_b_proj`` (mlx-lm's sanitize splits it; kept in float so the split needs no
    requantization), and a source stored in fp8 with ``weight_scale_inv`` (written as it is,
    16 returned by the caller's rule). Returns the sidecar's size."""
    import mlx.core as mx

    tensors = mx.load(str(raw))
    if bits >= 16 or any(k.endswith("weight_scale_inv") for k in tensors):
        import os

        os.replace(raw, out)
        return out.stat().st_size
    target = getattr(mx, dtype)
    weights = {}
    for name, v in tensors.items():
        if "e_score_correction_bias" in name or not mx.issubdtype(v.dtype, mx.floating):
            weights[name] = v
            continue
        v = v.astype(target)
        if name.endswith(".weight") and v.ndim == 2 and v.shape[-1] % group_size == 0 \
                and not name.endswith(("mlp.gate.weight", "kv_b_proj.weight")):
            w, s, b = mx.quantize(v, group_size=group_size, bits=bits)
            base = name[: -len(".weight")]
            weights.update({f"{base}.weight": w, f"{base}.scales": s, f"{base}.biases": b})
        else:
            weights[name] = v
    mx.eval(weights)
    tmp = out.with_name(out.name + ".tmp.safetensors")
    mx.save_safetensors(str(tmp), weights, metadata={"format": "mlx"})
    tmp.replace(out)
    return out.stat().st_size


def grafted_config(config: dict, *, source: str, commit: str | None, mtp_layers: int,
                   norms: str | None = "raw_hf_delta", packing: dict | None = None) -> dict:
    """The model's config.json declaring the sidecar (MTPLX's keys) and where it came from.
    ``norms``: how the sidecar stores its norms ("raw_hf_delta": zero-centred as Qwen
    publishes them, "mlx_multiplier": 1 + w; None: a nextn layer, whose plain norms and
    ``num_nextn_predict_layers`` the config already describes, with ``mtp_layers`` 0);
    ``packing``: its affine quantization, if any."""
    out = dict(config)
    text = out.get("text_config") if isinstance(out.get("text_config"), dict) else out
    if not mtp_layers:
        pass
    elif text is out:
        out["mtp_num_hidden_layers"] = text.get("mtp_num_hidden_layers") or mtp_layers
    else:
        out["text_config"] = {**text, "mtp_num_hidden_layers":
                              text.get("mtp_num_hidden_layers") or mtp_layers}
    out["mlx_lm_extra_tensors"] = {"mtp_file": SIDECAR}
    if norms:
        out["mtp_norm_encoding"] = norms
    out.pop("mtplx_mtp_quantization", None)
    if packing:
        out["mtplx_mtp_quantization"] = {"prequantized": True, "bits": int(packing["bits"]),
                                         "group_size": int(packing.get("group_size", 64)),
                                         "mode": "affine"}
    out["mtpchat_graft"] = {"source": source, "commit": commit,
                            "bits": int(packing["bits"]) if packing else 16}
    return out


def measure_acceptance(folder: Path, *, cancel: threading.Event | None = None,
                       depth: int = CALIBRATION_DEPTH, max_tokens: int = CALIBRATION_TOKENS
                       ) -> tuple[float, int]:
    """Greedy acceptance (accepted / drafted) at ``depth`` on the built-in calibration
    prompts, and the number of drafted tokens it is measured on."""
    import engine
    from engine.types import SamplingParams

    model = engine.load(folder)
    drafted = accepted = 0
    for prompt in CALIBRATION:
        ids = model.chat_ids([{"role": "user", "content": prompt}], enable_thinking=False)
        for event in model.generate(ids, max_tokens=max_tokens, depth=depth, cancel=cancel,
                                    sampling=SamplingParams(temperature=0.0)):
            if event.stats is not None and event.stats.drafted:
                drafted += len(event.stats.drafted)
                accepted += event.stats.accepted
    return (accepted / drafted if drafted else 0.0), drafted
