"""Sizes of the catalog's nextn / Qwen3-Next entries, computed from their published configs.

``python -m tests.catalog_sizes`` prints, per repo, the catalog fields this module derives
(parameters, download and converted bytes, memory per quantization); ``--json`` prints the
entries themselves, ready for ``resources/catalog.json``. ``tests/engine/hub/test_catalog_sizes.py``
checks that the catalog holds exactly these numbers.

Why counted this way: parameters are counted by building transformers' own ``*ForCausalLM`` on
the ``meta`` device from the published config (no memory, no download), plus what transformers
drops at load and the checkpoint stores: the MTP layer (one decoder layer of the trunk's MoE kind)
with its ``enorm`` / ``hnorm`` / ``eh_proj`` / ``shared_head.norm`` and the embedding / LM-head
copies (nextn families), or Qwen3-Next's ``mtp.fc`` / ``pre_fc_norm_*`` / ``mtp.norm``. The
router's ``e_score_correction_bias`` is a buffer in transformers and a tensor in the checkpoint,
so it is counted too. Download bytes follow the stored dtype (bf16; DeepSeek-V3.x ships the
decoder layers' linear weights in fp8 with a float32 ``weight_scale_inv`` per 128 x 128 block,
the rest bf16). Memory uses the engine's own rule (``engine.hub.inspection.memory_needed``: text
weights + 10 % + caches for 8k tokens + 512 MiB), where text weights are what the engine loads:
everything but the nextn copies (it shares the trunk's embedding and LM head). DeepSeek's fp8
weights are dequantized to bf16 at load (mlx-lm's sanitize), so its "bf16" memory is bf16's.
Converted sizes use the existing entries' rule: every text parameter at ``bits`` plus a 16-bit
scale and bias per group of 64.
"""
from __future__ import annotations

import argparse
import json
import math

GROUP = 64
FP8_BLOCK = 128
SIZES_NOTE = "estimated from the published architecture (not measured on the Hub)"

# The published config.json values that decide the sizes (the rest — RoPE, eps, routing
# scales — do not change a parameter count). Sources: the model cards / config.json of each repo
# as quoted by transformers' configuration classes (their defaults are the flagship's) and by
# training scripts in public repos (slime's glm4.5-355B-A32B.sh / glm4.5-106B-A12B.sh).
QWEN3_NEXT = {  # Qwen/Qwen3-Next-80B-A3B-{Instruct,Thinking}: transformers' Qwen3NextConfig
    "model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 5120, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_hidden_layers": 48,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "num_experts": 512,
    "num_experts_per_tok": 10, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}
GLM45 = {  # zai-org/GLM-4.5 and GLM-4.6 (same architecture; 4.6 only extends the context)
    "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 5120,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 92,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "use_qk_norm": True, "attention_bias": True,
    "partial_rotary_factor": 0.5, "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}
GLM45_AIR = dict(GLM45, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
                 num_hidden_layers=46, n_routed_experts=128, first_k_dense_replace=1,
                 use_qk_norm=False)
GLM47_FLASH = {  # zai-org/GLM-4.7-Flash: transformers' Glm4MoeLiteConfig (first layer dense)
    "model_type": "glm4_moe_lite", "vocab_size": 154880, "hidden_size": 2048,
    "intermediate_size": 10240, "moe_intermediate_size": 1536, "num_hidden_layers": 47,
    "num_attention_heads": 20, "num_key_value_heads": 20, "q_lora_rank": 768,
    "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "n_routed_experts": 64, "n_shared_experts": 1, "num_experts_per_tok": 4,
    "first_k_dense_replace": 1, "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3, -V3-0324, -V3.1: transformers' DeepseekV3Config
    "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}

_QN = "Mixture of experts, ~3B active per token; hybrid Gated DeltaNet + gated attention; MTP head"
_GLM = "Mixture of experts, ~{a}B active per token; MTP as a nextn layer"
_DS = ("Mixture of experts, ~37B active per token; MLA; ships fp8 (dequantized to bf16 at load);"
       " MTP as a nextn layer")
REPOS = {
    "Qwen/Qwen3-Next-80B-A3B-Instruct": ("qwen3_next", QWEN3_NEXT, "bfloat16", _QN),
    "Qwen/Qwen3-Next-80B-A3B-Thinking": ("qwen3_next", QWEN3_NEXT, "bfloat16",
                                         _QN + "; thinking model"),
    "zai-org/GLM-4.5-Air": ("glm4_moe", GLM45_AIR, "bfloat16", _GLM.format(a=12)),
    "zai-org/GLM-4.5": ("glm4_moe", GLM45, "bfloat16", _GLM.format(a=32)),
    "zai-org/GLM-4.6": ("glm4_moe", GLM45, "bfloat16", _GLM.format(a=32) + "; 200k context"),
    "zai-org/GLM-4.7-Flash": ("glm4_moe_lite", GLM47_FLASH, "bfloat16",
                              "Mixture of experts, ~3B active per token; MLA; MTP as a nextn layer"),
    "deepseek-ai/DeepSeek-V3.1": ("deepseek_v3", DEEPSEEK_V3, "float8_e4m3fn",
                                  _DS + "; hybrid thinking"),
    "deepseek-ai/DeepSeek-V3-0324": ("deepseek_v3", DEEPSEEK_V3, "float8_e4m3fn", _DS),
}


def _hf_config(config: dict):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**config)
    if config["model_type"] == "glm4_moe_lite":  # its per-layer MLP kinds, plus the MTP layer
        n = config["num_hidden_layers"]
        k = config["first_k_dense_replace"]
        cfg.mlp_layer_types = ["dense"] * k + ["sparse"] * (n + 1 - k)
    return cfg


def _shapes(module, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """What the module saves: parameters and persistent buffers (the router's correction
    bias is a buffer in transformers, a tensor in the checkpoint)."""
    return {prefix + n: tuple(t.shape) for n, t in module.state_dict().items()}


def checkpoint_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every stored tensor's shape (transformers' names; fused experts as one 3-D tensor)."""
    key = json.dumps(config, sort_keys=True)
    if key not in _SHAPES:
        _SHAPES[key] = _count_on_meta(config)
    return _SHAPES[key]


_SHAPES: dict[str, dict] = {}  # several repos share one architecture


def _count_on_meta(config: dict) -> dict[str, tuple[int, ...]]:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = _hf_config(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
        shapes = _shapes(model)
        layer_cls = type(model.model.layers[-1])
        h, v = config["hidden_size"], config["vocab_size"]
        if config["model_type"] == "qwen3_next":
            # one full-attention MoE layer (index 3 is the first full-attention one)
            layer = layer_cls(cfg, config["full_attention_interval"] - 1)
            shapes |= _shapes(layer, "mtp.layers.0.")
            shapes |= {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
                       "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
        else:
            n = config["num_hidden_layers"]
            p = f"model.layers.{n}."
            shapes |= _shapes(layer_cls(cfg, n), p)
            shapes |= {p + "enorm.weight": (h,), p + "hnorm.weight": (h,),
                       p + "eh_proj.weight": (h, 2 * h), p + "shared_head.norm.weight": (h,),
                       p + "embed_tokens.weight": (v, h), p + "shared_head.head.weight": (v, h)}
    return shapes


def _is_copy(name: str) -> bool:
    """The nextn layer's byte copies of the embedding and LM head (stored, not loaded)."""
    return name.startswith("model.layers.") and \
        name.endswith((".embed_tokens.weight", ".shared_head.head.weight"))


def _fp8_matrices(name: str, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """The [out, in] matrices DeepSeek-V3 stores in fp8: the decoder layers' projections
    (attention, dense and shared MLPs, every expert), not the router, norms, embedding, LM
    head, copies or ``eh_proj``."""
    if ".layers." not in name or _is_copy(name) or "eh_proj" in name or "norm" in name:
        return []
    if name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias"):
        return []
    if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]: gate and up per expert
        e, two_i, hd = shape
        return [(two_i // 2, hd)] * (2 * e)
    if name.endswith("experts.down_proj"):  # [E, H, I]
        e, hd, i = shape
        return [(hd, i)] * e
    return [shape] if len(shape) == 2 and name.endswith("proj.weight") else []


def sizes(repo_id: str) -> dict:
    """The catalog entry of ``repo_id`` computed from its published config."""
    from engine.hub.inspection import memory_needed

    family, config, dtype, description = REPOS[repo_id]
    shapes = checkpoint_shapes(config)
    count = {n: math.prod(s) for n, s in shapes.items()}
    total = sum(count.values())
    text = total - sum(c for n, c in count.items() if _is_copy(n))
    download = 2 * total
    if dtype == "float8_e4m3fn":
        for name, shape in shapes.items():
            for out_dim, in_dim in _fp8_matrices(name, shape):
                scales = math.ceil(out_dim / FP8_BLOCK) * math.ceil(in_dim / FP8_BLOCK)
                download += -out_dim * in_dim + 4 * scales  # 1 byte a weight, not 2; + scales
    quants = {"bf16": {"download_bytes": download, "memory_bytes": memory_needed(2 * text, config),
                       "needs_conversion": False}}
    for bits in (8, 4):
        conv = text * (bits * GROUP + 32) // (8 * GROUP)
        quants[f"{bits}bit"] = {"download_bytes": download, "converted_bytes": conv,
                                "memory_bytes": memory_needed(conv, config),
                                "needs_conversion": True, "bits": bits}
    return {
        "repo_id": repo_id, "name": repo_id.split("/", 1)[1], "family": family,
        "parameters_b": round(total / 1e9, 2), "text_parameters_b": round(text / 1e9, 2),
        "active_parameters_b": round(active_parameters(config, count) / 1e9, 2),
        "has_mtp": True, "mtp_layers": 1, "layout": "hf", "dtype": dtype, "moe": True,
        "official": True, "sizes": SIZES_NOTE, "quantizations": quants,
        "description": description,
    }


def active_parameters(config: dict, count: dict[str, int]) -> int:
    """Parameters a decode step reads: the trunk (no MTP layer) with only the routed experts
    a token picks (``num_experts_per_tok`` of them per MoE layer)."""
    mtp = (f"model.layers.{config['num_hidden_layers']}.", "mtp.")
    trunk = {n: c for n, c in count.items() if not n.startswith(mtp)}
    experts = config.get("n_routed_experts") or config["num_experts"]
    routed = sum(c for n, c in trunk.items() if ".experts." in n)
    return sum(trunk.values()) - routed + routed * config["num_experts_per_tok"] // experts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the catalog entries as JSON")
    ap.add_argument("repos", nargs="*", default=list(REPOS))
    args = ap.parse_args(argv)
    entries = [sizes(r) for r in args.repos]
    if args.json:
        print(json.dumps(entries, indent=1))
        return 0
    gb = 1e9
    for e in entries:
        q = e["quantizations"]
        print(f"{e['repo_id']}: {e['parameters_b']}B params ({e['text_parameters_b']}B loaded, "
              f"{e['active_parameters_b']}B active), {e['dtype']}, download "
              f"{q['bf16']['download_bytes'] / gb:.1f} GB; memory bf16 "
              f"{q['bf16']['memory_bytes'] / gb:.1f} / 8bit {q['8bit']['memory_bytes'] / gb:.1f}"
              f" / 4bit {q['4bit']['memory_bytes'] / gb:.1f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
