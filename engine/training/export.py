"""Write a trained :class:`DemoModel` in the raw Hugging Face layout Qwen publishes.

``config.json`` mirrors Qwen3.5-0.8B's (``Qwen3_5ForConditionalGeneration``, model_type
``qwen3_5``, nested ``text_config`` with ``mtp_num_hidden_layers: 1``); tensors are named
``model.language_model.*`` (trunk) and ``mtp.*`` (head), with zero-centred RMSNorm weights
(scale = 1 + w, as stored by transformers), the raw conv1d layout [C, 1, K], and no
``lm_head.weight`` (tied to ``embed_tokens``). Safetensors only, never pickle.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.training.model import DemoModel, ModelSize, layer_types, rope_parameters

WEIGHTS = "model.safetensors"
TRUNK_PREFIX = "model.language_model."
MTP_PREFIX = "mtp."


def state_dict_for_export(model: DemoModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Tensor name -> contiguous tensor in Qwen's raw naming."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.trunk.model.state_dict().items():
        out[TRUNK_PREFIX + name] = tensor
    for name, tensor in model.mtp.state_dict().items():
        out[MTP_PREFIX + name] = tensor
    # A_log stays float32 whatever the export dtype (Qwen keeps it at full precision too).
    return {k: (v if k.endswith("A_log") else v.to(dtype)).detach().contiguous().clone()
            for k, v in sorted(out.items())}


def load_into(model: DemoModel, weights: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`state_dict_for_export` (strict: every tensor must match)."""
    trunk = {k[len(TRUNK_PREFIX):]: v.float() for k, v in weights.items()
             if k.startswith(TRUNK_PREFIX)}
    mtp = {k[len(MTP_PREFIX):]: v.float() for k, v in weights.items() if k.startswith(MTP_PREFIX)}
    unknown = set(weights) - {TRUNK_PREFIX + k for k in trunk} - {MTP_PREFIX + k for k in mtp}
    if unknown:
        raise ValueError(f"unexpected tensors: {sorted(unknown)[:5]}")
    model.trunk.model.load_state_dict(trunk, strict=True)
    model.mtp.load_state_dict(mtp, strict=True)


def config_json(size: ModelSize, *, vocab_size: int, ids: dict[str, int], dtype: str) -> dict:
    import transformers

    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": None,
        "dtype": dtype,
        "eos_token_id": ids["<|im_end|>"],
        "full_attention_interval": size.full_attention_interval,
        "head_dim": size.head_dim,
        "hidden_act": "silu",
        "hidden_size": size.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": size.intermediate_size,
        "layer_types": layer_types(size),
        "linear_conv_kernel_dim": size.linear_conv_kernel_dim,
        "linear_key_head_dim": size.linear_key_head_dim,
        "linear_num_key_heads": size.linear_num_key_heads,
        "linear_num_value_heads": size.linear_num_value_heads,
        "linear_value_head_dim": size.linear_value_head_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": size.max_position_embeddings,
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": size.num_attention_heads,
        "num_hidden_layers": size.num_hidden_layers,
        "num_key_value_heads": size.num_key_value_heads,
        "pad_token_id": ids["<|endoftext|>"],
        "partial_rotary_factor": size.partial_rotary_factor,
        "rms_norm_eps": size.rms_norm_eps,
        "rope_parameters": rope_parameters(size),
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "language_model_only": True,
        "model_type": "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": True,
        "transformers_version": transformers.__version__,
    }


def generation_config_json(ids: dict[str, int]) -> dict:
    import transformers

    return {
        "bos_token_id": None,
        "do_sample": True,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": transformers.__version__,
    }


def export_model(model: DemoModel, size: ModelSize, out_dir: Path, *, ids: dict[str, int],
                 dtype: torch.dtype = torch.float32) -> list[Path]:
    """Write config.json, generation_config.json and model.safetensors; returns the paths.

    The tokenizer files are written separately (:func:`tokenizer.save_tokenizer`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    cfg = config_json(size, vocab_size=model.config.vocab_size, ids=ids, dtype=dtype_name)
    paths = [out_dir / "config.json", out_dir / "generation_config.json", out_dir / WEIGHTS]
    paths[0].write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(json.dumps(generation_config_json(ids), indent=2) + "\n",
                        encoding="utf-8")
    tmp = out_dir / (WEIGHTS + ".tmp")
    save_file(state_dict_for_export(model, dtype), str(tmp), metadata={"format": "pt"})
    tmp.replace(paths[2])
    return paths


def read_export(model_dir: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) of an exported folder (one file or an index of shards)."""
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [WEIGHTS]
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        weights.update(load_file(str(model_dir / name)))
    return cfg, weights
