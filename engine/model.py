"""``engine.load(path) -> Model``: the trunk (mlx-lm's classes) plus this project's MTP head.

The MTP head shares ``embed_tokens`` and the LM head with the trunk. The +1 shift of
zero-centred norms is applied exactly once: by mlx-lm's sanitize for the trunk and by
``sanitize_mtp`` for the head, both only when the checkpoint is in raw HF layout.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

from engine import decode, loading
from engine.adaptive import AdaptiveDepth
from engine.drafters import Drafter
from engine.errors import GenerationError, ModelLoadError, UnsupportedModelError
from engine.session import PromptCache
from engine.types import MAX_DEPTH, DraftMode, Event, ModelInfo, SamplingParams

log = logging.getLogger(__name__)


class Model:
    """A loaded model. Not thread-safe: one thread owns it (MLX streams are thread-local).

    Besides the weights it keeps what carries from one reply to the next: ``prompt_cache``
    (decode-state snapshots, so a follow-up turn does not prefill the conversation again) and
    ``depth_controller`` (what ``depth="auto"`` has learnt; made by the first such reply).
    """

    def __init__(self, *, trunk, mtp, tokenizer, info: ModelInfo) -> None:
        self.trunk = trunk            # mlx_lm.models.qwen3_5.Model
        self.mtp = mtp                # engine.mtp.MTPHead | None
        self.tokenizer = tokenizer
        self.info = info
        self.prompt_cache = PromptCache()
        self.depth_controller: AdaptiveDepth | None = None

    @property
    def text_model(self):
        return self.trunk.language_model

    def chat_ids(self, messages: list[dict], *, enable_thinking: bool | None = None,
                 add_generation_prompt: bool = True) -> list[int]:
        """Apply the model's chat template (rendered by transformers in a Jinja sandbox)."""
        kwargs = {}
        if enable_thinking is not None and self.info.supports_thinking:
            kwargs["enable_thinking"] = enable_thinking
        if not getattr(self.tokenizer, "chat_template", None):
            raise GenerationError("This model has no chat template; use a raw prompt instead.")
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, **kwargs)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)

    def generate(self, prompt_ids: list[int], *, max_tokens: int = 256, depth: int | str = 0,
                 sampling: SamplingParams | None = None, seed: int | None = None,
                 cancel: threading.Event | None = None, stop_strings: tuple[str, ...] = (),
                 drafter: Drafter | None = None, draft_mode: DraftMode = "filtered",
                 profile: bool = False) -> Iterator[Event]:
        """Stream events; see ``engine.decode.generate`` for the contract. Every argument is
        checked here, before anything reaches MLX: a bad one raises ``GenerationError``."""
        return decode.generate(self, prompt_ids, max_tokens=max_tokens, depth=depth,
                               sampling=SamplingParams() if sampling is None else sampling,
                               seed=seed, cancel=cancel, stop_strings=stop_strings,
                               drafter=drafter, draft_mode=draft_mode, profile=profile)

    def reset_prompt_cache(self) -> None:
        self.prompt_cache = PromptCache()


def _build_trunk(cfg: loading.ModelConfig):
    from mlx_lm.models import qwen3_5, qwen3_5_moe

    module = qwen3_5_moe if cfg.family == "qwen3_5_moe" else qwen3_5
    text = dict(cfg.text)
    text.setdefault("model_type", cfg.family)
    args = module.ModelArgs.from_dict({"model_type": cfg.family, "text_config": text})
    return module.Model(args)


def _quantize(module, weights: dict, quant: dict, prefix: str = "") -> None:
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


def _apply(module, weights: dict, what: str) -> None:
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(
            f"The {what} weights do not match config.json: {exc}. The checkpoint is corrupt "
            "or belongs to a different model size.") from exc


def load(path: str | Path, *, dtype: str | None = None) -> Model:
    """Load a model folder. ``dtype`` ("float32", "bfloat16", "float16") casts float weights."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.qwen3_5 import TextModelArgs

    from engine.mtp import MTPHead, sanitize_mtp

    folder = Path(path).expanduser()
    cfg = loading.read_config(folder)
    tokenizer = loading.load_tokenizer(folder)
    raw_weights = loading.load_weights(folder)
    raw_layout = loading.is_raw_hf_layout(raw_weights)
    mtp_raw = {k: v for k, v in raw_weights.items() if k.startswith("mtp.")}
    trunk_raw = loading.stack_per_expert(
        {k: v for k, v in raw_weights.items() if not k.startswith("mtp.")})

    trunk = _build_trunk(cfg)
    try:
        trunk_w = trunk.sanitize(trunk_raw)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"Unexpected weight layout: {exc}") from exc
    if cfg.quantization:
        _quantize(trunk, trunk_w, cfg.quantization)
    _apply(trunk, trunk_w, "trunk")

    args = TextModelArgs.from_dict(dict(cfg.text))
    n_mtp = int(cfg.text.get("mtp_num_hidden_layers", 0) or 0)
    mtp = None
    notes: list[str] = []
    if mtp_raw:
        if n_mtp < 1:
            n_mtp = 1 + max(int(k.split(".")[2]) for k in mtp_raw if k.startswith("mtp.layers."))
        mtp = MTPHead(args, num_layers=n_mtp)
        mtp_w = sanitize_mtp(mtp_raw, shift_norms=raw_layout)
        if cfg.quantization:
            _quantize(mtp, {f"mtp.{k}": v for k, v in mtp_w.items()}, cfg.quantization, "mtp.")
        _apply(mtp, mtp_w, "MTP head")
    else:
        notes.append("No mtp.* tensors: plain decoding only. Converters such as mlx_lm.convert "
                     "drop the MTP head; convert from the official Qwen repo to keep it.")
    if dtype is not None:
        target = getattr(mx, dtype)
        for m in (trunk, mtp):
            if m is None:
                continue
            # set_dtype's predicate sees dtypes, not names: cast by path to keep A_log as is.
            m.load_weights([(k, v.astype(target)) for k, v in tree_flatten(m.parameters())
                            if mx.issubdtype(v.dtype, mx.floating) and not k.endswith("A_log")],
                           strict=False)
    mx.eval(trunk.parameters(), mtp.parameters() if mtp else {})

    params = sum(v.size for _, v in tree_flatten(trunk.parameters()))
    if mtp is not None:
        params += sum(v.size for _, v in tree_flatten(mtp.parameters()))
    first = next(iter(trunk_w.values()))
    template = getattr(tokenizer, "chat_template", None) or ""
    info = ModelInfo(
        path=str(folder), name=folder.name, architecture=cfg.architecture, family=cfg.family,
        layout="hf" if raw_layout else "mlx", num_parameters=int(params),
        bytes_on_disk=loading.folder_bytes(folder), quantization=cfg.quantization,
        has_mtp=mtp is not None, mtp_layers=n_mtp if mtp is not None else 0,
        max_depth=MAX_DEPTH if mtp is not None else 0,
        context_length=int(cfg.text.get("max_position_embeddings", 32768)),
        vocab_size=int(cfg.text["vocab_size"]), hidden_size=int(cfg.text["hidden_size"]),
        num_layers=int(cfg.text["num_hidden_layers"]), dtype=str(dtype or first.dtype).replace("mlx.core.", ""),
        eos_token_ids=loading.eos_ids(folder, cfg, tokenizer),
        supports_thinking="enable_thinking" in template, notes=tuple(notes))
    log.info("loaded %s (%s, %s layout, %.1fM params, MTP=%s)", info.name, info.family,
             info.layout, info.num_parameters / 1e6, info.has_mtp)
    return Model(trunk=trunk, mtp=mtp, tokenizer=tokenizer, info=info)


__all__ = ["Model", "load", "UnsupportedModelError", "ModelLoadError"]
