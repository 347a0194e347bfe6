"""Float32 torch logits from an exported folder: the oracle for the MLX engine's parity tests.

The model is rebuilt from ``config.json`` with the trainer's own modules (transformers' Qwen3.5
trunk + :class:`MTPHead`) and the safetensors are loaded back, so what the engine reads from
disk is compared against what the trainer computed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.training.export import load_into, read_export
from engine.training.model import DemoModel, ModelSize, text_config


def size_from_config(text: dict) -> ModelSize:
    """The :class:`ModelSize` described by an exported ``text_config``."""
    rope = text.get("rope_parameters") or {}
    kinds = text.get("layer_types") or []
    interval = text.get("full_attention_interval") or (kinds.index("full_attention") + 1)
    return ModelSize(
        hidden_size=text["hidden_size"], num_hidden_layers=text["num_hidden_layers"],
        intermediate_size=text["intermediate_size"],
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"], head_dim=text["head_dim"],
        linear_num_key_heads=text["linear_num_key_heads"],
        linear_key_head_dim=text["linear_key_head_dim"],
        linear_num_value_heads=text["linear_num_value_heads"],
        linear_value_head_dim=text["linear_value_head_dim"],
        linear_conv_kernel_dim=text["linear_conv_kernel_dim"],
        full_attention_interval=interval,
        max_position_embeddings=text["max_position_embeddings"],
        rope_theta=float(rope.get("rope_theta", 10_000_000.0)),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", 0.25)),
        rms_norm_eps=text["rms_norm_eps"])


def load_model(model_dir: str | Path) -> DemoModel:
    """A float32 :class:`DemoModel` holding the exported weights (eval mode)."""
    cfg, weights = read_export(Path(model_dir))
    text = cfg["text_config"]
    size = size_from_config(text)
    model = DemoModel(text_config(size, vocab_size=text["vocab_size"],
                                  eos_token_id=text.get("eos_token_id"),
                                  pad_token_id=text.get("pad_token_id")))
    load_into(model, weights)
    return model.eval()


def reference_logits(model_dir: str | Path, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(trunk logits [T, V], MTP logits [T-1, V]) in float32.

    Row t of the MTP logits is the head's step-1 output for the pair (h_t, x_{t+1}) at rotary
    position t, attending to the pairs of positions <= t; it predicts x_{t+2}.
    """
    model = load_model(model_dir)
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    with torch.no_grad():
        hidden, logits = model.trunk_forward(ids)
        mtp = model.mtp_chains(hidden, ids, 1)[0]
    return logits[0].numpy(), mtp[0].numpy()


def reference_draft_chains(model_dir: str | Path, token_ids: list[int],
                           depth: int) -> list[np.ndarray]:
    """MTP logits of every draft chain, steps 1..depth, each step fed the previous argmax.

    Entry s-1 is [T-s, V]: row t is step s of the chain started at (h_t, x_{t+1}), rotated at
    position t+s-1 (see :meth:`DemoModel.mtp_chains`).
    """
    model = load_model(model_dir)
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    with torch.no_grad():
        hidden, _ = model.trunk_forward(ids)
        chains = model.mtp_chains(hidden, ids, depth, feed_drafts=True)
    return [c[0].numpy() for c in chains]
