"""Reading a model folder: config, safetensors (validated), layouts, quantization, tokenizer.

Supported: raw Hugging Face layout as Qwen publishes it (``Qwen3_5ForConditionalGeneration`` /
``Qwen3_5MoeForConditionalGeneration`` with ``model.language_model.*``, ``model.visual.*``
(ignored) and ``mtp.*``; the text-only ``*ForCausalLM`` layout) and the MLX layout written by
``engine convert`` or mlx-lm (shifted norms, transposed conv1d, optional affine quantization).
Only safetensors are read; no code from the model folder is ever executed.
"""
from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError, UnsupportedModelError

log = logging.getLogger(__name__)

DENSE_TYPES = {"qwen3_5", "qwen3_5_text"}
MOE_TYPES = {"qwen3_5_moe", "qwen3_5_moe_text"}
SUPPORTED_ARCHS = {
    "Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM",
}
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4,
                "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class ModelConfig:
    """The parts of config.json the engine needs."""

    raw: dict
    text: dict
    family: str  # "qwen3_5" | "qwen3_5_moe"
    architecture: str
    quantization: dict | None


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ModelLoadError(f"{what} is missing: {path} does not exist. Re-download the model.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{what} is malformed ({path.name}: {exc}). Re-download the model.") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{what} is malformed: {path.name} does not hold a JSON object.")
    return data


def read_config(folder: Path) -> ModelConfig:
    if not folder.is_dir():
        raise ModelLoadError(f"Model folder not found: {folder}")
    raw = read_json(folder / "config.json", "config.json")
    text = raw.get("text_config", raw)
    if not isinstance(text, dict):
        raise ModelLoadError("config.json is malformed: text_config is not an object.")
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else ""
    mtype = raw.get("model_type", "")
    ttype = text.get("model_type", mtype)
    if mtype in MOE_TYPES or ttype in MOE_TYPES:
        family = "qwen3_5_moe"
    elif mtype in DENSE_TYPES or ttype in DENSE_TYPES:
        family = "qwen3_5"
    else:
        raise UnsupportedModelError(
            f"Unsupported model type {mtype or '(none)'!r} ({arch or 'no architecture'}). "
            "MTP Chat runs Qwen3.5 / Qwen3.6 models (dense and MoE) with their MTP heads.")
    if arch and arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"Unsupported architecture {arch!r}. Supported: {', '.join(sorted(SUPPORTED_ARCHS))}.")
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"):
        if not isinstance(text.get(key), int):
            raise ModelLoadError(f"config.json is malformed: {key!r} is missing or not an integer.")
    quant = raw.get("quantization") or raw.get("quantization_config")
    if quant is not None and "bits" not in quant:
        raise UnsupportedModelError(
            f"Unsupported quantization {quant!r}: only MLX affine 4/8-bit models are supported.")
    return ModelConfig(raw=raw, text=text, family=family, architecture=arch or family,
                       quantization=quant)


def safetensors_header(path: Path) -> dict:
    """Parse and validate a safetensors header; catches truncated and corrupt files."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{path.name} is truncated (empty file). Re-download it.")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100_000_000):
                raise ModelLoadError(f"{path.name} is corrupt (bad header length). Re-download it.")
            header = json.loads(f.read(n))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path.name} is corrupt or unreadable ({exc}). Re-download it.") from exc
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = meta["data_offsets"]
            count = 1
            for d in meta["shape"]:
                count *= d
            expected = count * _DTYPE_BYTES.get(meta["dtype"], 0)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{path.name} is corrupt (tensor {name!r}).") from exc
        if meta["dtype"] in _DTYPE_BYTES and stop - start != expected:
            raise ModelLoadError(f"{path.name} is corrupt (tensor {name!r} has a wrong byte size).")
        end = max(end, stop)
    if 8 + n + end > size:
        raise ModelLoadError(
            f"{path.name} is truncated ({size} bytes, header needs {8 + n + end}). "
            "The download did not finish: download the model again.")
    return header


def weight_files(folder: Path) -> list[Path]:
    index_path = folder / "model.safetensors.index.json"
    if index_path.exists():
        index = read_json(index_path, "model.safetensors.index.json")
        wm = index.get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise ModelLoadError("model.safetensors.index.json has no weight_map.")
        files = sorted(set(wm.values()))
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise ModelLoadError(
                f"The index names {len(missing)} missing shard(s): {', '.join(missing[:3])}. "
                "The download is incomplete: download the model again.")
        return [folder / f for f in files]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt*")]
        hint = (" Only PyTorch pickle files were found; MTP Chat loads safetensors only "
                "(pickles can run code).") if pickles else ""
        raise ModelLoadError(f"No .safetensors weights in {folder}.{hint}")
    return files


def load_weights(folder: Path) -> dict:
    """All tensors of the folder as MLX arrays (lazy, memory-mapped by MLX)."""
    import mlx.core as mx

    weights: dict = {}
    for path in weight_files(folder):
        safetensors_header(path)
        try:
            weights.update(mx.load(str(path)))
        except Exception as exc:  # noqa: BLE001 - MLX raises plain RuntimeError/ValueError
            raise ModelLoadError(f"Could not read {path.name}: {exc}. Re-download it.") from exc
    return weights


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
        if (k.startswith(prefix_filter) and "experts" in parts
                and parts[parts.index("experts") + 1].isdigit() and not k.startswith("mtp.")):
            i = parts.index("experts")
            groups.setdefault((".".join(parts[:i]), parts[i + 2]), {})[int(parts[i + 1])] = v
        else:
            rest[k] = v
    for (prefix, proj), per in groups.items():
        rest[f"{prefix}.switch_mlp.{proj}.weight"] = mx.stack([per[e] for e in sorted(per)])
    return rest


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    if not ((folder / "tokenizer.json").exists() or (folder / "tokenizer.model").exists()
            or (folder / "vocab.json").exists()):
        raise ModelLoadError(
            f"No tokenizer in {folder} (tokenizer.json missing). Download the model's tokenizer files.")
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise ModelLoadError(f"The tokenizer could not be loaded: {exc}") from exc
    template = folder / "chat_template.jinja"
    if not getattr(tok, "chat_template", None) and template.exists():
        tok.chat_template = template.read_text(encoding="utf-8")
    return tok


def eos_ids(folder: Path, cfg: ModelConfig, tokenizer) -> tuple[int, ...]:
    ids: list[int] = []
    gen_path = folder / "generation_config.json"
    sources = [read_json(gen_path, "generation_config.json")] if gen_path.exists() else []
    sources += [cfg.text, cfg.raw]
    for src in sources:
        e = src.get("eos_token_id")
        for i in (e if isinstance(e, list) else [e]):
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return tuple(ids)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
