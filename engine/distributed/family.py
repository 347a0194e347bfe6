"""What is family-specific about splitting a model across ranks: which families split, how
(mlx-lm's own ``shard`` / ``pipeline``), and the model fingerprint every rank compares.

``SHARDERS`` maps a family to its function ``(trunk, group, mode) -> None``; another family
plugs in by adding one. Qwen3.5/3.6 (dense and MoE) use mlx-lm's
``qwen3_5.Model.shard(group)`` (tensor parallel: Gated DeltaNet conv and projections,
attention heads, MLP and experts split; each layer's output summed with one ``all_sum``) and
``Qwen3_5TextModel.pipeline(group)`` (pipeline parallel: contiguous layers per rank, the
hidden passed on with ``send``/``recv`` and given to every rank with one ``all_gather``).
The MTP head is not split: every rank keeps it whole (see docs/distributed.md for why).
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from pathlib import Path

from engine.errors import UnsupportedModelError

MODES = ("tensor", "pipeline")


def _qwen3_5_divides(text: dict, n: int) -> list[str]:
    """The sizes tensor parallelism over ``n`` ranks must divide (mlx-lm's ``shard``
    asserts or silently mis-splits otherwise)."""
    keys = ["num_attention_heads", "linear_num_key_heads", "linear_num_value_heads",
            "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"]
    bad = [f"{k} {text[k]}" for k in keys
           if isinstance(text.get(k), int) and text[k] and text[k] % n]
    if not text.get("tie_word_embeddings", True) and int(text.get("vocab_size", 0)) % n:
        bad.append(f"vocab_size {text['vocab_size']}")
    return bad


def shard_qwen3_5(trunk, group, mode: str, text: dict | None = None) -> None:
    """Split a Qwen3.5/3.6 trunk (mlx-lm's ``Model``) across ``group`` in place."""
    n = group.size()
    if mode == "tensor":
        bad = _qwen3_5_divides(text or {}, n)
        if bad:
            raise UnsupportedModelError(
                f"tensor parallel over {n} ranks needs these sizes divisible by {n}: "
                f"{', '.join(bad)}; use --pipeline or another number of hosts")
        trunk.shard(group)
        return
    layers = len(trunk.language_model.model.layers)
    if layers < n:
        raise UnsupportedModelError(f"pipeline parallel over {n} ranks needs at least {n} "
                                    f"layers; this model has {layers}")
    trunk.language_model.model.pipeline(group)


SHARDERS: dict[str, Callable] = {"qwen3_5": shard_qwen3_5, "qwen3_5_moe": shard_qwen3_5}


def sharder(family: str) -> Callable:
    """The split function for ``family``, or a one-line ``UnsupportedModelError``."""
    fn = SHARDERS.get(family)
    if fn is None:
        raise UnsupportedModelError(
            f"model family {family!r} cannot be split across machines yet (supported: "
            f"{', '.join(sorted(SHARDERS))})")
    return fn


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"the split mode is one of {', '.join(MODES)}, not {mode!r}")
    return mode


FINGERPRINT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                     "chat_template.jinja", "generation_config.json")
MAX_HEADER = 100 * 2**20
SAMPLE = 256 * 2**10  # bytes of weights read at each end of each safetensors file


def fingerprint(folder: Path, shards: list[Path]) -> bytes:
    """sha256 over the model's config and tokenizer files, each safetensors header (names,
    dtypes, shapes, offsets), each file's size and the first and last ``SAMPLE`` bytes of
    its weights: another checkpoint of the same shapes differs too, at a read of 512 KiB a
    file (a fraction of a second on a model of hundreds of files)."""
    h = hashlib.sha256()
    for name in FINGERPRINT_FILES:
        path = folder / name
        h.update(name.encode() + b"\0")
        if path.is_file():
            h.update(hashlib.sha256(path.read_bytes()).digest())
    for path in sorted(shards, key=lambda p: p.name):
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            raw = f.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0
            h.update(f.read(min(n, MAX_HEADER)))
            h.update(f.read(SAMPLE))
            size = path.stat().st_size
            f.seek(max(f.tell(), size - SAMPLE))
            h.update(f.read(SAMPLE))
        h.update(struct.pack("<Q", size))
    return h.digest()
