"""Raw Hugging Face checkpoint -> MLX layout, optionally 4/8-bit, keeping the MTP head.

The output has shifted norms and transposed conv1d (what mlx-lm writes), plus ``mtp.*``
tensors. The MTP head is quantized to at least 8 bits (never below the trunk; ``fc`` never below 8,
MTP_SPEC §2): see ``_quantize`` for the acceptance measured at each precision. Writing goes to a fresh temporary folder beside the destination, owned by this
conversion and renamed into place at the end, so a cancelled or failed conversion never leaves
a half-written model behind and never touches a folder it did not create.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from engine.errors import EngineError, ModelLoadError

log = logging.getLogger(__name__)

COPY_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json", "chat_template.jinja", "chat_template.json",
              "vocab.json", "merges.txt", "tokenizer.model", "README.md", "LICENSE",
              "preprocessor_config.json")
SHARD_BYTES = 4 * 2**30
GROUP_SIZES = (32, 64, 128)


class ConversionError(EngineError):
    """The conversion's options or destination are not usable."""


class ConversionCancelled(EngineError):
    """The user cancelled the conversion; nothing was written."""


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise ConversionCancelled("Conversion cancelled.")


def _save_shards(weights: dict, out: Path) -> None:
    import mlx.core as mx

    shards: list[dict] = [{}]
    size = 0
    for k in sorted(weights):
        v = weights[k]
        if size + v.nbytes > SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.nbytes
    if len(shards) == 1:
        mx.save_safetensors(str(out / "model.safetensors"), shards[0], metadata={"format": "mlx"})
        return
    wm = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})
        wm.update({k: name for k in shard})
    total = sum(v.nbytes for v in weights.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": wm}, indent=1))


def check_options(bits: object, group_size: object, dtype: object = None,
                  vision_bits: object = None) -> None:
    """Refuse bad options before any work, with the option named."""
    if bits is not None and (bits not in (4, 8) or isinstance(bits, bool)):
        raise ConversionError(f"--bits must be 4 or 8, not {bits!r}.")
    if vision_bits is not None and (vision_bits not in (4, 8) or isinstance(vision_bits, bool)):
        raise ConversionError(f"--vision-bits must be 4 or 8, not {vision_bits!r}.")
    if group_size not in GROUP_SIZES or isinstance(group_size, bool):
        raise ConversionError(f"--group-size must be one of {', '.join(map(str, GROUP_SIZES))}, "
                              f"not {group_size!r}.")
    if dtype not in (None, "float32", "bfloat16", "float16"):
        raise ConversionError(f"--dtype must be float32, bfloat16 or float16, not {dtype!r}.")


def convert(src: str | Path, dst: str | Path, *, bits: int | None = None, group_size: int = 64,
            dtype: str | None = None, progress: Callable[[float, str], None] | None = None,
            cancel: threading.Event | None = None, vision_bits: int | None = None) -> Path:
    """Convert ``src`` to MLX layout in ``dst``. ``bits``: None (no quantization), 4 or 8.
    ``vision_bits``: quantize the vision encoder too (off by default: it is small beside the
    trunk, and images then read exactly as the checkpoint does).

    The output is written into a fresh temporary folder beside ``dst`` that this call creates
    (and alone removes on failure), then renamed to ``dst``.
    """
    from engine.models.model import load

    report = progress or (lambda f, m: None)
    src, dst = Path(src), Path(dst)
    check_options(bits, group_size, dtype, vision_bits)
    if dst.exists() or dst.is_symlink():
        raise ConversionError(f"{dst} already exists; choose another destination or delete it.")
    report(0.0, "loading")
    model = load(src, dtype=dtype)
    if model.info.quantization:
        raise ModelLoadError(f"{src} is already quantized; convert from the original checkpoint.")
    _check_cancel(cancel)
    quant_cfg = None
    if bits is not None:
        report(0.3, f"quantizing to {bits} bits")
        quant_cfg = _quantize(model, bits=bits, group_size=group_size)
    extra = {}
    if vision_bits is not None:
        if model.vision is None:
            raise ConversionError(f"--vision-bits: {src} has no vision encoder to quantize.")
        from engine.vision.encoder import quantize

        extra["vision_quantization"] = quantize(model.vision, bits=vision_bits,
                                                group_size=group_size)
    _check_cancel(cancel)
    report(0.6, "writing")
    _write(model, src, dst, quant_cfg, cancel, extra)
    report(1.0, "done")
    log.info("converted %s -> %s (bits=%s)", src, dst, bits)
    return dst


MTP_MIN_BITS = 8  # measured: a 4-bit head loses acceptance, an 8-bit one keeps it (README)


def _quantize(model, *, bits: int, group_size: int) -> dict:
    """Quantize the trunk to ``bits`` and the MTP head to at least MTP_MIN_BITS.

    On the demo model (greedy, depth 3, 16 held-out prompts) acceptance was 0.914 with the head
    unquantized, 0.914 at 8 bits, 0.903 at 4 bits (fc at 8) and 0.907 with the whole head at 4
    bits; mlx-lm's MTP work measured MoE acceptance collapsing from 79-85 % to 5-11 % with a
    quantized head. The head is one layer, so 8 bits costs little disk.
    """
    import mlx.nn as nn

    def fits(m) -> bool:
        return hasattr(m, "to_quantized") and getattr(m, "weight", None) is not None \
            and m.weight.shape[-1] % group_size == 0

    nn.quantize(model.trunk, group_size=group_size, bits=bits,
                class_predicate=lambda p, m: fits(m))
    quant_cfg: dict = {"group_size": group_size, "bits": bits}
    if model.mtp is not None:
        head = {"group_size": group_size, "bits": max(bits, MTP_MIN_BITS)}
        nn.quantize(model.mtp, group_size=group_size, bits=head["bits"],
                    class_predicate=lambda p, m: fits(m))
        for name, mod in model.mtp.named_modules():
            # every packed module (QuantizedLinear, mlx-lm's QuantizedSwitchLinear of MoE
            # experts): a reader must unpack each at the head's bits, not the trunk's
            if getattr(mod, "bits", None) and hasattr(mod, "scales"):
                quant_cfg[f"mtp.{name}"] = dict(head)
    return quant_cfg


def _write(model, src: Path, dst: Path, quant_cfg: dict | None,
           cancel: threading.Event | None, extra: dict | None = None) -> None:
    """Write into a temp folder this call owns, beside ``dst``; rename it into place."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine.models.checkpoint import read_json

    weights = dict(tree_flatten(model.trunk.parameters()))
    if model.mtp is not None:
        weights.update({f"mtp.{k}": v for k, v in tree_flatten(model.mtp.parameters())})
    if model.vision is not None:  # as loaded, or packed by --vision-bits
        from engine.vision.encoder import PREFIX

        weights.update({PREFIX + k: v for k, v in tree_flatten(model.vision.parameters())})
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.converting-", dir=dst.parent))
    try:
        mx.eval(weights)
        _save_shards(weights, staging)
        _check_cancel(cancel)
        config = read_json(src / "config.json", "config.json")
        config.pop("quantization_config", None)
        if quant_cfg:
            config["quantization"] = quant_cfg
        config.pop("vision_quantization", None)
        config.update(extra or {})
        config["mtpchat_converted_from"] = str(src)
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        for name in COPY_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, staging / name)
        if dst.exists():
            raise ConversionError(f"{dst} appeared while converting; nothing was replaced.")
        staging.rename(dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
