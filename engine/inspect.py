"""Look at a model before loading or downloading it: is it supported, can it speculate, does it fit?

Only ``config.json``, the safetensors index and the safetensors *headers* are read (the 8-byte
little-endian header length, then the JSON header): never the weights. Remotely the headers are
fetched with HTTP Range requests, so checking a 50 GB repo costs a few hundred KB.

Both functions return the same plain dict (JSON-able); see :func:`analyse` for its keys.
"""
from __future__ import annotations

import json
import logging
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.errors import ModelLoadError

log = logging.getLogger(__name__)

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2,
               "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
               "F8_E8M0": 1, "F4": 1}
ARCH_FAMILY = {
    "Qwen3_5ForConditionalGeneration": "qwen3_5", "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe", "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
}
TYPE_FAMILY = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
               "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe"}
VISION_PREFIXES = ("model.visual.", "visual.", "vision_tower.", "model.vision_tower.")
MAX_HEADER = 100 * 2**20
MAX_REMOTE_SHARDS = 128
CONTEXT_FOR_ESTIMATE = 8192
RUNTIME_OVERHEAD = 512 * 2**20
CONVERT_HINT = "convert from the official Qwen repo: python -m engine pull {repo} --convert --bits 4"

TensorMeta = dict  # name -> {"dtype": str, "shape": list[int]}


# ----------------------------------------------------------------------------- headers

def parse_header(blob: bytes) -> dict:
    """The JSON header of a safetensors file given its first bytes (length prefix included)."""
    if len(blob) < 8:
        raise ModelLoadError("not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER:
        raise ModelLoadError(f"safetensors header of {n} bytes is not plausible")
    if len(blob) < 8 + n:
        raise ModelLoadError("safetensors header is truncated")
    try:
        header = json.loads(blob[8:8 + n])
    except ValueError as exc:
        raise ModelLoadError(f"safetensors header is not JSON: {exc}") from exc
    header.pop("__metadata__", None)
    return header


def read_header(path: str | Path) -> dict:
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"{path} is not a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise ModelLoadError(f"{path}: safetensors header of {n} bytes is not plausible")
        return parse_header(head + fh.read(n))


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


# ----------------------------------------------------------------------------- analysis

def _family(config: dict) -> tuple[str | None, str | None]:
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    for a in archs:
        if a in ARCH_FAMILY:
            return a, ARCH_FAMILY[a]
    text = config.get("text_config") or {}
    for mt in (config.get("model_type"), text.get("model_type")):
        if mt in TYPE_FAMILY:
            return arch, TYPE_FAMILY[mt]
    return arch, None


def _is_vision(name: str) -> bool:
    return name.startswith(VISION_PREFIXES)


def _layout(names: list[str], tensors: dict | None) -> str | None:
    if any(n.startswith("model.language_model.") for n in names):
        return "hf"
    if tensors:
        for n, meta in tensors.items():
            if n.endswith("conv1d.weight"):
                shape = meta.get("shape") or []
                return "hf" if len(shape) == 3 and shape[1] == 1 and shape[2] != 1 else "mlx"
    if any(n.startswith("language_model.model.") for n in names):
        return "mlx"
    return None


def _params(tensors: dict, quant: dict | None) -> int:
    """Parameter count; packed quantized weights (uint32 beside .scales) are unpacked."""
    bits = int(quant.get("bits", 4)) if quant else None
    total = 0
    for name, meta in tensors.items():
        if quant and (name.endswith(".scales") or name.endswith(".biases")):
            continue
        n = _numel(meta.get("shape", []))
        base = name.rsplit(".", 1)[0]
        if bits and meta.get("dtype") == "U32" and f"{base}.scales" in tensors:
            n = n * 32 // bits
        total += n
    return total


def _cache_estimate(text: dict) -> int:
    """KV cache for CONTEXT_FOR_ESTIMATE tokens + the Gated DeltaNet states (float32)."""
    layers = int(text.get("num_hidden_layers") or 0)
    interval = int(text.get("full_attention_interval") or 4)
    full = layers // interval if interval else layers
    kv = 2 * full * int(text.get("num_key_value_heads") or 0) * int(text.get("head_dim") or 0)
    kv_bytes = kv * 2 * CONTEXT_FOR_ESTIMATE
    gdn = (layers - full) * int(text.get("linear_num_value_heads") or 0) * \
        int(text.get("linear_value_head_dim") or 0) * int(text.get("linear_key_head_dim") or 0) * 4
    return kv_bytes + 4 * gdn  # states kept for a few verify positions


def memory_needed(weight_bytes: int, text_config: dict) -> int:
    """Bytes of memory to run: the text weights, caches for 8k tokens, 10% + 512 MiB slack."""
    return int(weight_bytes * 1.10) + _cache_estimate(text_config) + RUNTIME_OVERHEAD


def analyse(config: dict, *, names: list[str], tensors: dict | None, total_bytes: int,
            source: str, repo_id: str | None = None, notes: list[str] | None = None) -> dict:
    """Turn what was read into the inspection report.

    Keys: source, architecture, family, model_type, layout, parameters (None if unknown),
    parameters_estimated, bytes (all weight files), weight_bytes (text weights the engine loads),
    quantization, has_mtp, mtp_layers, memory_needed_bytes, supported, can_speculate,
    reasons (why not / warnings), fix (a command to run, or None), machine (memory verdict).
    """
    arch, family = _family(config)
    text = config.get("text_config") or config
    quant = config.get("quantization") or None
    has_mtp = any(n.startswith(("mtp.", "language_model.mtp.", "model.mtp.")) for n in names)
    text_names = [n for n in names if not _is_vision(n)]
    if tensors:
        weight_bytes = sum(_numel(m["shape"]) * DTYPE_BYTES.get(m["dtype"], 2)
                           for n, m in tensors.items() if not _is_vision(n))
        params, estimated = _params(tensors, quant), False
    else:
        weight_bytes = total_bytes
        dtype = str(text.get("dtype") or config.get("torch_dtype") or "bfloat16")
        per = 4 if "32" in dtype else 2
        params, estimated = (total_bytes // per if total_bytes and not quant else None), True
    reasons = list(notes or []) + _blockers(config, arch, family, names)
    supported = len(reasons) == len(notes or [])
    can_speculate = supported and has_mtp
    fix = None
    if supported and not has_mtp:
        reasons.append("no mtp.* tensors: the model will run but cannot speculate (typical of "
                       "mlx-community / mlx_lm.convert conversions, which drop the MTP head)")
        official = _official_repo_guess(repo_id, config)
        fix = CONVERT_HINT.format(repo=official)
    mem = memory_needed(weight_bytes, text)
    return {
        "source": source, "repo_id": repo_id, "architecture": arch, "family": family,
        "model_type": config.get("model_type"), "layout": _layout(text_names, tensors),
        "parameters": params, "parameters_estimated": estimated, "bytes": total_bytes,
        "weight_bytes": weight_bytes, "quantization": quant, "has_mtp": has_mtp,
        "mtp_layers": int(text.get("mtp_num_hidden_layers") or 0) if has_mtp else 0,
        "memory_needed_bytes": mem, "supported": supported, "can_speculate": can_speculate,
        "reasons": reasons, "fix": fix, "machine": machine_verdict(mem),
    }


def _blockers(config: dict, arch: str | None, family: str | None, names: list[str]) -> list[str]:
    """Why a model cannot run at all (empty when it can)."""
    out = []
    if family is None:
        out.append(f"architecture {arch or config.get('model_type')!r} is not supported "
                   "(MTP Chat runs Qwen3.5 / Qwen3.6 models)")
    foreign = config.get("quantization_config") or None
    if foreign and not config.get("quantization"):
        out.append(f"quantized with {foreign.get('quant_method', 'unknown')!r}, which MLX "
                   "cannot load")
    if not names:
        out.append("no safetensors weights found")
    return out


def _official_repo_guess(repo_id: str | None, config: dict) -> str:
    """Qwen/Qwen3.5-4B for mlx-community/Qwen3.5-4B-4bit; a placeholder when unsure."""
    import re

    m = re.search(r"(Qwen3\.[56]-[0-9.]+B(?:-A[0-9.]+B)?)", repo_id or "", re.IGNORECASE)
    return f"Qwen/{m.group(1)}" if m else "Qwen/Qwen3.5-<size>"


def machine_verdict(memory_bytes: int, *, total_memory: int | None = None) -> dict:
    """Does ``memory_bytes`` fit this machine's memory? (See engine.catalog for thresholds.)"""
    from engine.catalog import memory_verdict

    return memory_verdict(memory_bytes, total_memory=total_memory)


# ----------------------------------------------------------------------------- local

def _read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path} has no config.json") from exc
    except ValueError as exc:
        raise ModelLoadError(f"{path}/config.json is not valid JSON: {exc}") from exc


def inspect_local(path: str | Path) -> dict:
    """Inspect a model folder on disk (config.json + every *.safetensors header)."""
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"{path} is not a folder")
    config = _read_config(path)
    tensors: dict = {}
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(read_header(f))
        total += f.stat().st_size
    return analyse(config, names=list(tensors), tensors=tensors, total_bytes=total,
                   source=str(path))


# ----------------------------------------------------------------------------- remote

def _remote_header(repo_id: str, fname: str, revision: str, token: str | None) -> dict:
    from engine import hub

    head = hub.fetch_bytes(repo_id, fname, revision=revision, token=token, byte_range=(0, 7))
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER:
        raise ModelLoadError(f"{fname}: safetensors header of {n} bytes is not plausible")
    body = hub.fetch_bytes(repo_id, fname, revision=revision, token=token, byte_range=(8, 7 + n))
    return parse_header(head[:8] + body)


def inspect_repo(repo_id: str, *, revision: str = "main", token: str | None = None) -> dict:
    """Inspect a Hub repo without downloading weights: file list, config.json, index, headers."""
    from engine import hub

    listing = hub.list_repo(repo_id, revision=revision, token=token)
    shards = sorted(f.path for f in listing.files if f.path.endswith(".safetensors")
                    and "/" not in f.path)
    total = sum(f.size for f in listing.files if f.path in shards)
    if listing.file("config.json") is None:
        raise ModelLoadError(f"{repo_id} has no config.json: it is not a transformers model repo")
    rev = listing.commit
    config = json.loads(hub.fetch_bytes(repo_id, "config.json", revision=rev, token=token))
    tensors: dict | None = None
    names: list[str] = []
    notes: list[str] = []
    if listing.file("model.safetensors.index.json") is not None:
        index = json.loads(hub.fetch_bytes(repo_id, "model.safetensors.index.json",
                                           revision=rev, token=token))
        names = list((index.get("weight_map") or {}).keys())
    if shards and len(shards) <= MAX_REMOTE_SHARDS:
        with ThreadPoolExecutor(max_workers=min(8, len(shards))) as pool:
            headers = list(pool.map(lambda f: _remote_header(repo_id, f, rev, token), shards))
        tensors = {k: v for h in headers for k, v in h.items()}
        names = list(tensors)
    elif shards:
        notes.append(f"{len(shards)} weight files: sizes estimated from the file list")
    report = analyse(config, names=names, tensors=tensors, total_bytes=total,
                     source=f"{hub.endpoint()}/{repo_id}", repo_id=repo_id, notes=notes)
    report.update(revision=revision, commit=listing.commit,
                  download_bytes=sum(f.size for f in listing.files if needed_file(f.path)))
    return report


def needed_file(path: str) -> bool:
    """Files a model needs: weights, JSON configs, tokenizer files and the chat template."""
    if "/" in path:
        return False
    name = path.lower()
    return (name.endswith((".safetensors", ".json", ".jinja", ".tiktoken", ".model"))
            or name in ("merges.txt", "vocab.txt"))
