"""Reading what a model folder holds beyond its facts: the weights, the tokenizer, EOS ids.

Supported: raw Hugging Face layout as Qwen publishes it (``Qwen3_5ForConditionalGeneration`` /
``Qwen3_5MoeForConditionalGeneration`` with ``model.language_model.*``, ``model.visual.*``
(ignored) and ``mtp.*``; the text-only ``*ForCausalLM`` layout) and the MLX layout written by
``engine convert`` or mlx-lm (shifted norms, transposed conv1d, optional affine quantization).
Config and headers are read and validated by :mod:`engine.models.checkpoint` first; this module only
maps the weights (safetensors only: no code from the model folder is ever executed).
"""
from __future__ import annotations

import logging
from pathlib import Path

from engine.errors import ModelLoadError
from engine.models.checkpoint import Checkpoint, ModelConfig, read_json

log = logging.getLogger(__name__)


def load_arrays(ckpt: Checkpoint) -> dict:
    """All tensors of a validated checkpoint as MLX arrays (memory-mapped, lazy)."""
    import mlx.core as mx

    weights: dict = {}
    for path in ckpt.shards:
        try:
            weights.update(mx.load(str(path)))
        except Exception as exc:  # noqa: BLE001 - MLX raises plain RuntimeError/ValueError
            raise ModelLoadError(f"Could not read {path.name}: {exc}. Re-download it.") from exc
    return weights


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json")
MAX_TOKENIZER_FILE = 512 * 2**20


def _check_tokenizer_files(folder: Path) -> None:
    """transformers reads these without limits: a FIFO would hang it, /dev/zero exhaust memory."""
    import os
    import stat

    for name in TOKENIZER_FILES:
        path = folder / name
        if not (path.exists() or path.is_symlink()):
            continue
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ModelLoadError(f"{name} cannot be read ({exc.strerror or exc}).") from exc
        if not stat.S_ISREG(st.st_mode):
            raise ModelLoadError(f"{name} is not a regular file ({path}); refusing to read it.")
        if st.st_size > MAX_TOKENIZER_FILE:
            raise ModelLoadError(f"{name} is implausibly large ({st.st_size} bytes).")


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    if not ((folder / "tokenizer.json").exists() or (folder / "tokenizer.model").exists()
            or (folder / "vocab.json").exists()):
        raise ModelLoadError(
            f"No tokenizer in {folder} (tokenizer.json missing). Download the model's tokenizer files.")
    _check_tokenizer_files(folder)
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise ModelLoadError(f"The tokenizer could not be loaded: {exc}") from exc
    template = folder / "chat_template.jinja"
    if not getattr(tok, "chat_template", None) and template.is_file():
        from engine.models.checkpoint import read_regular

        data = read_regular(template, limit=4 * 2**20, what="chat_template.jinja")
        tok.chat_template = data.decode("utf-8", errors="replace")
    return tok


def eos_ids(folder: Path, cfg: ModelConfig, tokenizer) -> tuple[int, ...]:
    """The end-of-sequence ids the configs and the tokenizer name. Each must be a token of
    both the model (``vocab_size``) and the tokenizer (``ModelLoadError`` naming the field
    otherwise: a wrong one would never end a reply, and structured output cannot start)."""
    ids: list[int] = []
    gen_path = folder / "generation_config.json"
    sources = [("generation_config.json", read_json(gen_path, "generation_config.json"))] \
        if gen_path.exists() else []
    sources += [("config.json", cfg.text), ("config.json", cfg.raw)]
    sources.append(("the tokenizer's eos_token", {"eos_token_id": tokenizer.eos_token_id}))
    limit = min(int(cfg.text["vocab_size"]), len(tokenizer))
    for where, src in sources:
        e = src.get("eos_token_id")
        for i in (e if isinstance(e, list) else [e]):
            if i is None:
                continue
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < limit:
                raise ModelLoadError(
                    f"{where}: eos_token_id {i!r} is not a token of this model (an integer "
                    f"from 0 to {limit - 1}: vocab_size {cfg.text['vocab_size']}, "
                    f"{len(tokenizer)} tokens in the tokenizer). Fix the config or "
                    "re-download the model.")
            if i not in ids:
                ids.append(i)
    return tuple(ids)
