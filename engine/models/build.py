"""Building the trunk (mlx-lm's classes) and the MTP head from a validated config and weights.

``build(cfg, weights)`` is the only place modules are made from a checkpoint. The loader passes
the real (memory-mapped) arrays; :func:`check_build` passes lazy zero arrays shaped like the
safetensors headers, never evaluated, so ``inspect`` and ``pull`` can tell whether a folder
loads — same names, same shapes, same quantization — without reading a byte of weights.

Any failure is a :class:`ModelLoadError` that says what did not fit.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.errors import ModelLoadError
from engine.models.checkpoint import Checkpoint, ModelConfig

log = logging.getLogger(__name__)

MX_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
             "I64": "int64", "I32": "int32", "U32": "uint32", "I16": "int16", "U16": "uint16",
             "I8": "int8", "U8": "uint8", "BOOL": "bool_", "F8_E4M3": "uint8",
             "F8_E5M2": "uint8"}
MAX_MESSAGE = 400


@dataclass(frozen=True)
class Built:
    trunk: object                 # the family's mlx-lm Model
    mtp: object | None            # the family's MTP head module
    trunk_weights: dict
    raw_layout: bool
    mtp_layers: int
    notes: tuple[str, ...]
    vision: object | None = None  # engine.vision.encoder.VisionEncoder | None


def short_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "…"


def build(cfg: ModelConfig, weights: dict) -> Built:
    """Modules with ``weights`` in place (not evaluated), built by the checkpoint's family
    (``engine.models.families``); raises ModelLoadError."""
    from engine.models import families

    try:
        return families.get(cfg.family).build(cfg, weights)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - mlx / mlx-lm raise many kinds on bad checkpoints
        raise ModelLoadError(
            f"The model could not be built from config.json and its weights "
            f"({type(exc).__name__}: {short_error(exc)}). The checkpoint is corrupt or does not "
            "match its config.json.") from exc


def check_build(ckpt: Checkpoint) -> None:
    """Build from lazy arrays shaped like ``ckpt``'s headers: the loader's checks, no weights."""
    import mlx.core as mx

    weights = {n: mx.zeros(m["shape"], dtype=getattr(mx, MX_DTYPES[m["dtype"]]))
               for n, m in ckpt.tensors.items()}
    build(ckpt.config, weights)


MTP_ALIASES = ("model.language_model.mtp.", "language_model.mtp.", "model.mtp.")


def mtp_key(name: str) -> str:
    """``language_model.mtp.fc.weight`` (mlx-lm's MTP conversions) -> ``mtp.fc.weight``."""
    for alias in MTP_ALIASES:
        if name.startswith(alias):
            return "mtp." + name[len(alias):]
    return name


def build_trunk(cfg: ModelConfig):
    """The mlx_lm trunk model for ``cfg`` (its family's class), weights not yet loaded."""
    from engine.models import families

    return families.get(cfg.family).build_trunk(cfg)


def quantize_like(module, weights: dict, quant: dict, prefix: str = "") -> None:
    import mlx.nn as nn

    def predicate(path: str, m) -> bool | dict:
        if not hasattr(m, "to_quantized"):
            return False
        key = f"{prefix}{path}"
        if f"{key}.scales" not in weights:
            return False
        per = quant.get(key)
        return per if isinstance(per, dict) else True

    nn.quantize(module, group_size=quant.get("group_size", 64), bits=quant["bits"],
                class_predicate=predicate)


def apply_weights(module, weights: dict, what: str) -> None:
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(
            f"The {what} weights do not match config.json: {short_error(exc)}. The checkpoint is "
            "corrupt or belongs to a different model size.") from exc


def load_trunk(trunk, weights: dict, quant: dict | None) -> dict:
    """Put ``weights`` (the checkpoint's trunk tensors) into mlx-lm's ``trunk``: its own
    ``sanitize``, quantized like the checkpoint, loaded strictly; returns the sanitized
    weights. Every family builds its trunk this way."""
    try:
        trunk_w = trunk.sanitize(weights)
    except Exception as exc:  # noqa: BLE001 - any layout mlx-lm refuses is a load error
        raise ModelLoadError(f"Unexpected weight layout: {short_error(exc)}") from exc
    if not trunk_w:
        raise ModelLoadError("The checkpoint holds no trunk weights.")
    if quant:
        quantize_like(trunk, trunk_w, quant)
    apply_weights(trunk, trunk_w, "trunk")
    return trunk_w


def is_raw_hf_layout(weights: dict) -> bool:
    """Raw HF checkpoints keep conv1d as [C, 1, K]; MLX layout has [C, K, 1]."""
    return any("conv1d.weight" in k and v.shape[-1] != 1 for k, v in weights.items())


def stack_per_expert(weights: dict, prefix_filter: str = "") -> dict:
    """``...mlp.experts.N.{gate,up,down}_proj.weight`` -> stacked ``switch_mlp`` tensors."""
    import mlx.core as mx

    groups: dict[tuple[str, str], dict[int, object]] = {}
    rest = {}
    for k, v in weights.items():
        parts = k.split(".")
        i = parts.index("experts") if "experts" in parts else -1
        if (k.startswith(prefix_filter) and 0 <= i < len(parts) - 2
                and parts[i + 1].isdigit() and not k.startswith("mtp.")):
            groups.setdefault((".".join(parts[:i]), parts[i + 2]), {})[int(parts[i + 1])] = v
        else:
            rest[k] = v
    for (prefix, proj), per in groups.items():
        rest[f"{prefix}.switch_mlp.{proj}.weight"] = mx.stack([per[e] for e in sorted(per)])
    return rest
