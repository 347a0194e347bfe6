"""The one reader of a model's facts: ``config.json``, the safetensors index and headers.

The loader (``engine.models.model.load``), the pre-download check (``engine.hub.inspection``), the store's
listing and ``pull``'s check before installing all read a model through this module, so they
accept and refuse the same folders for the same reasons. It reads metadata only, never weights:

- files are read only when they are *regular* files, and never more than a fixed size (a FIFO
  or a symlink to ``/dev/zero`` named ``config.json`` is refused, not read);
- ``config.json`` is validated field by field (:func:`parse_config`): supported architecture
  and family, positive and plausible sizes, a well-formed MLX ``quantization``;
- each safetensors header is validated (:func:`parse_header`): an object of tensors with a
  known dtype, a shape of non-negative ints and byte offsets that match; then the file must be
  long enough for the data the header promises (a truncated download is caught here);
- shard names from ``model.safetensors.index.json`` must stay inside the model folder.

Every problem is a :class:`ModelLoadError` (or :class:`UnsupportedModelError`) naming the file
and the field. No code from the model folder is ever executed.
"""
from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.models.families import ARCH_FAMILY, NAMES, TYPE_FAMILY
from engine.paths import inside

SUPPORTED_ARCHS = frozenset(ARCH_FAMILY)
# safetensors dtype -> bytes per element (only dtypes MLX can load).
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2,
               "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
VISION_PREFIXES = ("model.visual.", "visual.", "vision_tower.", "model.vision_tower.")
MTP_PREFIXES = ("mtp.", "language_model.mtp.", "model.mtp.", "model.language_model.mtp.")
# MTPLX packs keep the MTP head in a file beside the trunk, not named by the index.
MTP_SIDECARS = ("mtp.safetensors", "mtp/weights.safetensors", "model-mtp.safetensors")
RUNTIME_FILE = "mtplx_runtime.json"
QUANT_BITS = (2, 3, 4, 5, 6, 8)
QUANT_GROUPS = (32, 64, 128)
MAX_JSON_BYTES = 64 * 2**20     # config, index, generation config
MAX_HEADER = 100 * 2**20        # one safetensors header
MAX_DIMS = 8
INDEX_FILE = "model.safetensors.index.json"
# (key, required, lowest, highest): the text config's sizes the engine builds from.
INT_FIELDS = (
    ("hidden_size", True, 1, 1 << 17), ("num_hidden_layers", True, 1, 1024),
    ("vocab_size", True, 1, 1 << 24), ("num_attention_heads", True, 1, 4096),
    ("num_key_value_heads", False, 1, 4096), ("head_dim", False, 1, 4096),
    ("intermediate_size", False, 1, 1 << 20), ("max_position_embeddings", False, 1, 1 << 24),
    ("linear_num_value_heads", False, 1, 4096), ("linear_num_key_heads", False, 1, 4096),
    ("linear_key_head_dim", False, 1, 4096), ("linear_value_head_dim", False, 1, 4096),
    ("linear_conv_kernel_dim", False, 1, 64), ("full_attention_interval", False, 1, 1024),
    ("mtp_num_hidden_layers", False, 0, 16), ("num_experts", False, 0, 4096),
    ("num_experts_per_tok", False, 0, 4096), ("moe_intermediate_size", False, 0, 1 << 20),
    ("shared_expert_intermediate_size", False, 0, 1 << 20),
    ("num_nextn_predict_layers", False, 0, 16), ("n_routed_experts", False, 0, 4096),
    ("first_k_dense_replace", False, 0, 1024), ("kv_lora_rank", False, 1, 1 << 16),
    ("qk_rope_head_dim", False, 1, 4096), ("qk_nope_head_dim", False, 1, 4096),
    ("v_head_dim", False, 1, 4096),
)

TensorMeta = dict  # {"dtype": str, "shape": list[int], "data_offsets": [int, int]}


# ----------------------------------------------------------------------------- bounded reads

def read_regular(path: Path, *, limit: int, what: str) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ModelLoadError(f"{what} is missing: {path} does not exist. "
                             "Re-download the model.") from None
    except OSError as exc:
        raise ModelLoadError(f"{what} cannot be read ({path}: {exc.strerror or exc}).") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelLoadError(f"{what} is not a regular file ({path}); refusing to read it.")
        if st.st_size > limit:
            raise ModelLoadError(f"{what} is implausibly large ({st.st_size} bytes, the limit "
                                 f"is {limit}); the file is corrupt.")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ModelLoadError(f"{what} is implausibly large (over {limit} bytes).")
    return data


def loads_json(data: bytes, *, what: str) -> dict:
    """A JSON object from bytes; anything else (or nesting too deep to parse) is malformed."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{what} is malformed ({exc}). Re-download the model.") from exc
    except RecursionError:
        raise ModelLoadError(f"{what} is malformed (nested too deeply).") from None
    if not isinstance(obj, dict):
        raise ModelLoadError(f"{what} is malformed: it does not hold a JSON object.")
    return obj


def read_json(path: Path, what: str, *, limit: int = MAX_JSON_BYTES) -> dict:
    return loads_json(read_regular(path, limit=limit, what=what), what=what)


# ----------------------------------------------------------------------------- config.json

@dataclass(frozen=True)
class ModelConfig:
    """The validated parts of config.json the engine needs."""

    raw: dict
    text: dict
    family: str  # a key of engine.models.families.MODULES
    architecture: str
    quantization: dict | None
    # "zero-centred" (raw HF deltas: add 1), "shifted" (already 1 + w), or None: like the trunk.
    mtp_norms: str | None = None
    mtp_quantization: dict | None = None  # the MTP head's own packing, when it differs

    @property
    def mtp_layers(self) -> int:
        return int(self.text.get("mtp_num_hidden_layers") or
                   self.text.get("num_nextn_predict_layers") or 0)

    @property
    def mtp_sidecar(self) -> str | None:
        """The MTP file an MTPLX pack declares (``mlx_lm_extra_tensors.mtp_file``)."""
        extra = self.raw.get("mlx_lm_extra_tensors")
        name = extra.get("mtp_file") if isinstance(extra, dict) else None
        return name if isinstance(name, str) and name else None


def read_config(folder: Path) -> ModelConfig:
    if not folder.is_dir():
        raise ModelLoadError(f"Model folder not found: {folder}")
    return parse_config(read_json(folder / "config.json", "config.json"))


def parse_config(raw: dict) -> ModelConfig:
    """Validate a config.json object; raises with the offending field named."""
    text = raw.get("text_config", raw)
    if not isinstance(text, dict):
        raise ModelLoadError("config.json is malformed: text_config is not an object.")
    arch, family = _family(raw, text)
    quantization = _quantization(raw)
    _check_ints(text)
    return ModelConfig(raw=raw, text=text, family=family, architecture=arch or family,
                       quantization=quantization, mtp_norms=_mtp_norms(raw),
                       mtp_quantization=_mtp_quantization(raw))


def norm_encoding(value: object) -> str | None:
    """A declared MTP norm encoding ("raw_hf_delta", "mlx_multiplier", ...) in this file's terms."""
    v = str(value or "").strip().lower()
    if not v:
        return None
    if any(w in v for w in ("delta", "zero", "raw", "hf")):
        return "zero-centred"
    if any(w in v for w in ("multiplier", "absolute", "shift", "mlx")):
        return "shifted"
    raise ModelLoadError(f"config.json is malformed: unknown MTP norm encoding {v[:40]!r}.")


def _mtp_norms(raw: dict) -> str | None:
    """MTPLX packs byte-copy Qwen's MTP head, so its norms stay zero-centred unless declared."""
    quant = raw.get("mtplx_mtp_quantization")
    quant = quant if isinstance(quant, dict) else {}
    for v in (raw.get("mtplx_mtp_norm_encoding"), raw.get("mtp_norm_encoding"),
              quant.get("norm_encoding"), quant.get("norm_weight_encoding")):
        if v is not None:
            return norm_encoding(v)
    if "mlx_lm_extra_tensors" in raw or "mtplx_mtp_quantization" in raw:
        return "zero-centred"
    return None


def _mtp_quantization(raw: dict) -> dict | None:
    q = raw.get("mtplx_mtp_quantization")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ModelLoadError("config.json is malformed: 'mtplx_mtp_quantization' is not an "
                             "object.")
    if "bits" not in q and not q.get("prequantized"):
        return None
    packed = {"bits": q.get("bits", 4), "group_size": q.get("group_size", 64)}
    _check_quant(packed, "mtplx_mtp_quantization")
    return packed


def _family(raw: dict, text: dict) -> tuple[str, str]:
    archs = raw.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ModelLoadError("config.json is malformed: 'architectures' is not a list of names.")
    arch = archs[0] if archs else ""
    mtype, ttype = raw.get("model_type", ""), text.get("model_type", raw.get("model_type", ""))
    if not isinstance(mtype, str) or not isinstance(ttype, str):
        raise ModelLoadError("config.json is malformed: 'model_type' is not a string.")
    families = {TYPE_FAMILY.get(mtype), TYPE_FAMILY.get(ttype)} - {None}
    if not families and not mtype and not ttype and arch in ARCH_FAMILY:
        families = {ARCH_FAMILY[arch]}  # no model_type: the architecture says it
    if not families:
        raise UnsupportedModelError(
            f"Unsupported model type {mtype or '(none)'!r} ({arch or 'no architecture'}). "
            f"MTP Chat runs {NAMES} models with their MTP heads.")
    family = "qwen3_5_moe" if "qwen3_5_moe" in families else sorted(families)[0]
    if arch and arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"Unsupported architecture {arch!r}. Supported: {', '.join(sorted(SUPPORTED_ARCHS))}.")
    return arch, family


def _check_ints(text: dict) -> None:
    for key, required, lo, hi in INT_FIELDS:
        if key not in text or text[key] is None:
            if required:
                raise ModelLoadError(f"config.json is malformed: {key!r} is missing or not an "
                                     "integer.")
            continue
        v = text[key]
        if not isinstance(v, int) or isinstance(v, bool):
            raise ModelLoadError(f"config.json is malformed: {key!r} is missing or not an "
                                 f"integer ({v!r}).")
        if not lo <= v <= hi:
            raise ModelLoadError(f"config.json is malformed: {key!r} is {v}, outside "
                                 f"{lo}..{hi}.")
    heads, kv = text["num_attention_heads"], text.get("num_key_value_heads")
    if kv and heads % kv:
        raise ModelLoadError(f"config.json is malformed: 'num_attention_heads' ({heads}) is not "
                             f"a multiple of 'num_key_value_heads' ({kv}).")
    experts = text.get("num_experts") or text.get("n_routed_experts")
    if experts and not 1 <= (text.get("num_experts_per_tok") or 0) <= experts:
        raise ModelLoadError("config.json is malformed: 'num_experts_per_tok' must be between 1 "
                             "and 'num_experts'.")
    eps = text.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ModelLoadError(f"config.json is malformed: 'rms_norm_eps' is {eps!r}.")


def _quantization(raw: dict) -> dict | None:
    quant = raw.get("quantization")
    foreign = raw.get("quantization_config")
    if quant is None and isinstance(foreign, dict) and "quant_method" not in foreign:
        quant = foreign  # mlx-lm writes its quantization under both names
    if quant is None:
        if foreign is not None:
            method = foreign.get("quant_method", "unknown") if isinstance(foreign, dict) else foreign
            raise UnsupportedModelError(
                f"Unsupported quantization: quantized with {method!r}, which MLX cannot load. "
                "Only MLX affine 4/8-bit models are supported.")
        return None
    if not isinstance(quant, dict):
        raise UnsupportedModelError(
            f"Unsupported quantization {quant!r} in config.json: 'quantization' must be an "
            "object with 'bits' and 'group_size' (MLX affine 4/8-bit).")
    _check_quant(quant, "quantization")
    for key, per in quant.items():
        if isinstance(per, dict):
            _check_quant(per, f"quantization.{key}")
    return quant


def _check_quant(q: dict, where: str) -> None:
    bits, group = q.get("bits"), q.get("group_size", 64)
    if bits not in QUANT_BITS or isinstance(bits, bool):
        raise UnsupportedModelError(f"Unsupported quantization: {where}.bits is {bits!r} "
                                    f"(MLX affine 4/8-bit models are supported).")
    if group not in QUANT_GROUPS or isinstance(group, bool):
        raise ModelLoadError(f"config.json is malformed: {where}.group_size is {group!r} "
                             f"(one of {', '.join(map(str, QUANT_GROUPS))}).")


# ----------------------------------------------------------------------------- safetensors

def parse_header(blob: bytes, *, name: str = "safetensors file") -> dict[str, TensorMeta]:
    """The validated tensors of a safetensors header, given its first bytes (with the length)."""
    if len(blob) < 8:
        raise ModelLoadError(f"{name} is truncated (shorter than 8 bytes). Re-download it.")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER:
        raise ModelLoadError(f"{name} is corrupt (a safetensors header of {n} bytes is not "
                             "plausible). Re-download it.")
    if len(blob) < 8 + n:
        raise ModelLoadError(f"{name} is truncated (its header is cut short). Re-download it.")
    try:
        header = loads_json(blob[8:8 + n], what=f"{name}'s header")
    except ModelLoadError as exc:
        raise ModelLoadError(f"{name} is corrupt ({exc}). Re-download it.") from exc
    header.pop("__metadata__", None)
    return {k: _check_tensor(k, meta, name) for k, meta in header.items()}


def _check_tensor(key: str, meta: object, name: str) -> TensorMeta:
    def bad(why: str) -> ModelLoadError:
        return ModelLoadError(f"{name} is corrupt (tensor {key[:200]!r}: {why}). Re-download it.")

    if not isinstance(meta, dict):
        raise bad("not an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise bad(f"dtype {str(dtype)[:40]!r} is not one MLX can load")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape):
        raise bad("bad shape")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(
            isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise bad("bad data_offsets")
    count = 1
    for d in shape:
        count *= d
    if offsets[1] - offsets[0] != count * DTYPE_BYTES[dtype]:
        raise bad("has a wrong byte size")
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def header_data_end(tensors: dict[str, TensorMeta]) -> int:
    return max((m["data_offsets"][1] for m in tensors.values()), default=0)


def read_header(path: str | Path) -> dict[str, TensorMeta]:
    """A local shard's validated header; also refuses a file too short for its data."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ModelLoadError(f"{path.name} cannot be read ({exc.strerror or exc}).") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelLoadError(f"{path.name} is not a regular file; refusing to read it.")
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        if n <= MAX_HEADER and 8 + n > st.st_size:
            raise ModelLoadError(f"{path.name} is truncated or corrupt (its header needs {n} "
                                 f"bytes, the file has {st.st_size}). Re-download it.")
        tensors = parse_header(head + fh.read(min(n, MAX_HEADER)), name=path.name)
    need = 8 + n + header_data_end(tensors)
    if need > st.st_size:
        raise ModelLoadError(
            f"{path.name} is truncated ({st.st_size} bytes, header needs {need}). "
            "The download did not finish: download the model again.")
    return tensors


def shard_files(folder: Path, config: ModelConfig | None = None) -> list[Path]:
    """The weight files: those the index names (inside the folder), else ``*.safetensors``;
    plus an MTP sidecar (MTPLX's ``mtp.safetensors``) the index does not name."""
    files = _indexed_or_globbed(folder)
    names = [config.mtp_sidecar] if config is not None and config.mtp_sidecar else []
    for rel in names + list(MTP_SIDECARS):
        path = folder / rel
        if (path.exists() or path.is_symlink()) and path not in files:
            files.append(inside(folder, rel, what="the MTP sidecar"))
        elif rel in names and not path.exists():
            raise ModelLoadError(f"config.json names the MTP file {rel!r}, which is missing. "
                                 "Re-download the model.")
    return files


def _indexed_or_globbed(folder: Path) -> list[Path]:
    if (folder / INDEX_FILE).exists() or (folder / INDEX_FILE).is_symlink():
        wm = read_json(folder / INDEX_FILE, INDEX_FILE).get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise ModelLoadError(f"{INDEX_FILE} has no weight_map.")
        if not all(isinstance(v, str) for v in wm.values()):
            bad = next(k for k, v in wm.items() if not isinstance(v, str))
            raise ModelLoadError(f"{INDEX_FILE} is malformed: weight_map[{bad[:80]!r}] is not a "
                                 "file name.")
        files = sorted(set(wm.values()))
        paths = [inside(folder, f, what=INDEX_FILE) for f in files]
        missing = [f for f, p in zip(files, paths) if not p.is_file()]
        if missing:
            raise ModelLoadError(
                f"The index names {len(missing)} missing shard(s): {', '.join(missing[:3])}. "
                "The download is incomplete: download the model again.")
        return paths
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt*")]
        hint = (" Only PyTorch pickle files were found; MTP Chat loads safetensors only "
                "(pickles can run code).") if pickles else ""
        raise ModelLoadError(f"No .safetensors weights in {folder}.{hint}")
    return [inside(folder, p.name, what="weight file") for p in files]


# ----------------------------------------------------------------------------- the facts

@dataclass(frozen=True)
class Checkpoint:
    """What a model folder (or a Hub repo, by its headers) holds, validated."""

    config: ModelConfig
    tensors: dict[str, TensorMeta]
    shards: tuple[Path, ...] = ()
    total_bytes: int = 0
    folder: Path | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def names(self) -> list[str]:
        return list(self.tensors)

    @property
    def has_mtp(self) -> bool:
        return has_mtp(self.tensors) or bool(nextn_names(self.config, self.tensors))

    @property
    def layout(self) -> str | None:
        return layout(self.tensors)

    @property
    def parameters(self) -> int:
        return parameters(self.tensors, self.config.quantization)

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.tensors)


def read_checkpoint(folder: str | Path) -> Checkpoint:
    """Validate a local model folder's config and every shard header (weights are not read)."""
    folder = Path(folder)
    config = read_config(folder)
    config = with_runtime(folder, config)
    shards = shard_files(folder, config)
    tensors: dict[str, TensorMeta] = {}
    total = 0
    for path in shards:
        tensors.update(read_header(path))
        total += path.stat().st_size
    return Checkpoint(config=config, tensors=tensors, shards=tuple(shards), total_bytes=total,
                      folder=folder)


def with_runtime(folder: Path, config: ModelConfig) -> ModelConfig:
    """An MTPLX ``mtplx_runtime.json`` may declare the MTP norm layout; it wins when present."""
    path = folder / RUNTIME_FILE
    if not path.is_file():
        return config
    declared = norm_encoding(read_json(path, RUNTIME_FILE).get("mtp_norm_layout"))
    from dataclasses import replace

    return replace(config, mtp_norms=declared or config.mtp_norms or "zero-centred")


def is_vision(name: str) -> bool:
    return name.startswith(VISION_PREFIXES)


def has_mtp(tensors) -> bool:
    return any(n.startswith(MTP_PREFIXES) for n in tensors)


def nextn_names(cfg: ModelConfig, names) -> list[str]:
    """The tensors of DeepSeek-style "nextn" MTP layers, stored as the layers after the last
    (``model.layers.{num_hidden_layers}.*``, GLM-4.x MoE and DeepSeek-V3)."""
    return nextn_in(cfg.text, names)


def nextn_in(text: dict, names) -> list[str]:
    """``nextn_names`` for a text config not yet validated (the hub's inspection)."""
    n = text.get("num_hidden_layers")
    if not isinstance(n, int) or isinstance(n, bool):
        return []
    return [k for k in names if k.startswith(f"model.layers.{n}.")]


def layout(tensors: dict) -> str | None:
    """"hf" (raw Hugging Face: conv1d [C, 1, K]) or "mlx" (converted: [C, K, 1])."""
    names = [n for n in tensors if not is_vision(n)]
    if any(n.startswith("model.language_model.") for n in names):
        return "hf"
    for n in names:
        if n.endswith("conv1d.weight"):
            shape = tensors[n].get("shape") or []
            return "hf" if len(shape) == 3 and shape[1] == 1 and shape[2] != 1 else "mlx"
    if any(n.startswith("language_model.model.") for n in names):
        return "mlx"
    if any(".mlp.experts.0." in n for n in names):
        return "hf"
    if any(".switch_mlp." in n for n in names):
        return "mlx"
    return None


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def parameters(tensors: dict, quant: dict | None) -> int:
    """Parameter count; packed quantized weights (uint32 beside .scales) are unpacked."""
    bits = int(quant.get("bits", 4)) if quant else None
    total = 0
    for name, meta in tensors.items():
        if quant and name.endswith((".scales", ".biases")):
            continue
        n = numel(meta.get("shape", []))
        if bits and meta.get("dtype") == "U32" and f"{name.rsplit('.', 1)[0]}.scales" in tensors:
            n = n * 32 // bits
        total += n
    return total


def weight_bytes(tensors: dict) -> int:
    """Bytes of the text weights the engine loads (vision tensors excluded)."""
    return sum(numel(m["shape"]) * DTYPE_BYTES.get(m["dtype"], 2)
               for n, m in tensors.items() if not is_vision(n))
