"""Tiny random checkpoints of the nextn MTP families in their raw Hugging Face layouts.

``build_tiny_family(out, "glm4_moe")`` writes what zai-org publishes for GLM-4.5 (and
``"deepseek_v3"`` what deepseek-ai publishes for DeepSeek-V3, without the fp8 packing):
``Glm4MoeForCausalLM`` / ``DeepseekV3ForCausalLM`` config, per-expert MoE tensors, the router's
``e_score_correction_bias``, and the nextn MTP layer as ``model.layers.{num_hidden_layers}.*``
with ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and byte copies of the embedding and
LM head (``embed_tokens``, ``shared_head.head``). Norms are plain RMSNorm weights (scale = w).
Weights are drawn with numpy from a seed, with the LM head scaled so logits are a few units
(float32 greedy near-ties are rare, parity is measured, not rounding). Safetensors only.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.tinymodels import save_sharded, write_tokenizer

FAMILIES = ("glm4_moe", "deepseek_v3", "glm4_moe_lite", "qwen3_next")
NEXTN = ("glm4_moe", "deepseek_v3", "glm4_moe_lite")  # the MTP layer as model.layers.{N}
MLA = ("deepseek_v3", "glm4_moe_lite")


def tiny_config(family: str, *, vocab_size: int = 384, hidden: int = 64, layers: int = 3,
                nextn: int = 1, **extra) -> dict:
    common = {
        "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "moe_intermediate_size": hidden // 2, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_scaling": None, "max_position_embeddings": 4096, "hidden_act": "silu",
        "tie_word_embeddings": False, "num_nextn_predict_layers": nextn,
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "dtype": "float32",
    }
    if family == "glm4_moe":
        return dict(common, model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"],
                    head_dim=16, partial_rotary_factor=0.5, use_qk_norm=True,
                    attention_bias=True, n_group=1, topk_group=1) | extra
    if family in MLA:
        arch = {"deepseek_v3": "DeepseekV3ForCausalLM",
                "glm4_moe_lite": "Glm4MoeLiteForCausalLM"}[family]
        return dict(common, model_type=family, architectures=[arch],
                    num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=2,
                    topk_group=1, moe_layer_freq=1, attention_bias=False,
                    rms_norm_eps=1e-6) | ({"n_group": 1} if family == "glm4_moe_lite" else {}) \
            | extra
    if family == "qwen3_next":
        # Qwen3-Next-80B-A3B's kinds of blocks: 3 GDN layers then 1 gated-attention layer,
        # MoE with a gated shared expert (layer 1 dense via mlp_only_layers, so both MLP
        # kinds run), two value heads per key head (the fused projections interleave them).
        common = {k: v for k, v in common.items() if k not in (
            "num_nextn_predict_layers", "n_routed_experts", "n_shared_experts",
            "first_k_dense_replace", "routed_scaling_factor", "topk_method", "scoring_func")}
        return dict(common, model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"],
                    num_hidden_layers=max(layers, 4), head_dim=16,
                    partial_rotary_factor=0.25, full_attention_interval=4,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8,
                    shared_expert_intermediate_size=hidden // 2, decoder_sparse_step=1,
                    mlp_only_layers=[1], attention_bias=False, rms_norm_eps=1e-6,
                    mtp_num_hidden_layers=nextn) | extra
    raise ValueError(family)


def _normal(rng, shape, scale) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)


def _attention(rng, cfg: dict, lin, norm) -> None:
    H, nq, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if cfg["model_type"] not in MLA:
        hd = cfg["head_dim"]
        for name, n in (("q_proj", nq), ("k_proj", nkv), ("v_proj", nkv)):
            lin(f"self_attn.{name}.weight", n * hd, H, bias=cfg["attention_bias"])
        lin("self_attn.o_proj.weight", H, nq * hd)
        norm("self_attn.q_norm.weight", hd)
        norm("self_attn.k_norm.weight", hd)
        return
    r, rope, nope, v = (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"],
                        cfg["v_head_dim"])
    lin("self_attn.q_a_proj.weight", cfg["q_lora_rank"], H)
    norm("self_attn.q_a_layernorm.weight", cfg["q_lora_rank"])
    lin("self_attn.q_b_proj.weight", nq * (nope + rope), cfg["q_lora_rank"])
    lin("self_attn.kv_a_proj_with_mqa.weight", r + rope, H)
    norm("self_attn.kv_a_layernorm.weight", r)
    lin("self_attn.kv_b_proj.weight", nq * (nope + v), r)
    lin("self_attn.o_proj.weight", H, nq * v)


def _layer(rng, cfg: dict, prefix: str, *, moe: bool) -> dict[str, np.ndarray]:
    H = cfg["hidden_size"]
    t: dict[str, np.ndarray] = {}

    def lin(name, out_dim, in_dim, *, bias=False, gain=1.0):
        t[f"{prefix}.{name}"] = _normal(rng, (out_dim, in_dim), gain / np.sqrt(in_dim))
        if bias:
            t[f"{prefix}.{name[:-len('weight')]}bias"] = _normal(rng, (out_dim,), 0.1)

    def norm(name, dim):  # plain RMSNorm: scale = w
        t[f"{prefix}.{name}"] = (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)

    norm("input_layernorm.weight", H)
    norm("post_attention_layernorm.weight", H)
    _attention(rng, cfg, lin, norm)
    if not moe:
        I = cfg["intermediate_size"]
        lin("mlp.gate_proj.weight", I, H)
        lin("mlp.up_proj.weight", I, H)
        lin("mlp.down_proj.weight", H, I, gain=2.0)
        return t
    E, MI = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    lin("mlp.gate.weight", E, H, gain=3.0)
    t[f"{prefix}.mlp.gate.e_score_correction_bias"] = _normal(rng, (E,), 0.1)
    for e in range(E):
        lin(f"mlp.experts.{e}.gate_proj.weight", MI, H)
        lin(f"mlp.experts.{e}.up_proj.weight", MI, H)
        lin(f"mlp.experts.{e}.down_proj.weight", H, MI, gain=2.0)
    SI = MI * cfg["n_shared_experts"]
    lin("mlp.shared_experts.gate_proj.weight", SI, H)
    lin("mlp.shared_experts.up_proj.weight", SI, H)
    lin("mlp.shared_experts.down_proj.weight", H, SI, gain=2.0)
    return t


def _qwen3_next_layer(rng, cfg: dict, prefix: str, *, linear: bool, moe: bool,
                      ) -> dict[str, np.ndarray]:
    """One Qwen3-Next decoder layer as Qwen publishes it: zero-centred norms (scale = 1 + w),
    the GDN's fused ``in_proj_qkvz`` / ``in_proj_ba`` (rows grouped per key head), a raw
    [C, 1, K] conv1d, per-expert MoE tensors with a gated shared expert."""
    H = cfg["hidden_size"]
    t: dict[str, np.ndarray] = {}

    def lin(name, out_dim, in_dim, gain=1.0):
        t[f"{prefix}.{name}"] = _normal(rng, (out_dim, in_dim), gain / np.sqrt(in_dim))

    def znorm(name, dim):
        t[f"{prefix}.{name}"] = (0.1 * rng.standard_normal(dim)).astype(np.float32)

    znorm("input_layernorm.weight", H)
    znorm("post_attention_layernorm.weight", H)
    if linear:
        nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv, K = (cfg["linear_key_head_dim"], cfg["linear_value_head_dim"],
                     cfg["linear_conv_kernel_dim"])
        conv_dim = 2 * nk * dk + nv * dv
        lin("linear_attn.in_proj_qkvz.weight", 2 * nk * dk + 2 * nv * dv, H)
        lin("linear_attn.in_proj_ba.weight", 2 * nv, H)
        lin("linear_attn.out_proj.weight", H, nv * dv, 4.0)
        t[f"{prefix}.linear_attn.conv1d.weight"] = _normal(rng, (conv_dim, 1, K), 0.5)
        t[f"{prefix}.linear_attn.dt_bias"] = rng.uniform(0.5, 1.5, nv).astype(np.float32)
        t[f"{prefix}.linear_attn.A_log"] = np.log(rng.uniform(1, 8, nv)).astype(np.float32)
        t[f"{prefix}.linear_attn.norm.weight"] = \
            (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)  # plain: scale = w
    else:
        nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        lin("self_attn.q_proj.weight", 2 * nq * hd, H)  # queries and their output gate
        lin("self_attn.k_proj.weight", nkv * hd, H)
        lin("self_attn.v_proj.weight", nkv * hd, H)
        lin("self_attn.o_proj.weight", H, nq * hd, 4.0)
        znorm("self_attn.q_norm.weight", hd)
        znorm("self_attn.k_norm.weight", hd)
    if not moe:
        I = cfg["intermediate_size"]
        lin("mlp.gate_proj.weight", I, H)
        lin("mlp.up_proj.weight", I, H)
        lin("mlp.down_proj.weight", H, I, 2.0)
        return t
    E, MI, SI = cfg["num_experts"], cfg["moe_intermediate_size"], \
        cfg["shared_expert_intermediate_size"]
    lin("mlp.gate.weight", E, H, gain=3.0)
    for e in range(E):
        lin(f"mlp.experts.{e}.gate_proj.weight", MI, H)
        lin(f"mlp.experts.{e}.up_proj.weight", MI, H)
        lin(f"mlp.experts.{e}.down_proj.weight", H, MI, gain=2.0)
    lin("mlp.shared_expert.gate_proj.weight", SI, H)
    lin("mlp.shared_expert.up_proj.weight", SI, H)
    lin("mlp.shared_expert.down_proj.weight", H, SI, gain=2.0)
    lin("mlp.shared_expert_gate.weight", 1, H)
    return t


def qwen3_next_weights(cfg: dict, *, seed: int = 0, with_mtp: bool = True,
                       ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    w = {"model.embed_tokens.weight": _normal(rng, (V, H), 1.0),
         "model.norm.weight": (0.1 * rng.standard_normal(H)).astype(np.float32),
         "lm_head.weight": _normal(rng, (V, H), 3.0 / np.sqrt(H))}
    for i in range(L):
        w.update(_qwen3_next_layer(rng, cfg, f"model.layers.{i}",
                                   linear=(i + 1) % cfg["full_attention_interval"] != 0,
                                   moe=i not in cfg["mlp_only_layers"]))
    for j in range(cfg["mtp_num_hidden_layers"] if with_mtp else 0):
        w.update(_qwen3_next_layer(rng, cfg, f"mtp.layers.{j}", linear=False, moe=True))
    if with_mtp:
        w["mtp.fc.weight"] = _normal(rng, (H, 2 * H), 1 / np.sqrt(2 * H))
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            w[f"mtp.{n}.weight"] = (0.1 * rng.standard_normal(H)).astype(np.float32)
    return w


def tiny_family_weights(cfg: dict, *, seed: int = 0, with_mtp: bool = True,
                        ) -> dict[str, np.ndarray]:
    if cfg["model_type"] == "qwen3_next":
        return qwen3_next_weights(cfg, seed=seed, with_mtp=with_mtp)
    rng = np.random.default_rng(seed)
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    w = {"model.embed_tokens.weight": _normal(rng, (V, H), 1.0),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32),
         "lm_head.weight": _normal(rng, (V, H), 3.0 / np.sqrt(H))}
    for i in range(L):
        w.update(_layer(rng, cfg, f"model.layers.{i}", moe=i >= cfg["first_k_dense_replace"]))
    for j in range(cfg["num_nextn_predict_layers"] if with_mtp else 0):
        p = f"model.layers.{L + j}"
        w.update(_layer(rng, cfg, p, moe=True))
        w[f"{p}.enorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        w[f"{p}.hnorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        w[f"{p}.eh_proj.weight"] = _normal(rng, (H, 2 * H), 1 / np.sqrt(2 * H))
        w[f"{p}.shared_head.norm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        w[f"{p}.shared_head.head.weight"] = w["lm_head.weight"].copy()
        w[f"{p}.embed_tokens.weight"] = w["model.embed_tokens.weight"].copy()
    return w


def build_tiny_family(out: str | Path, family: str, *, seed: int = 0, with_mtp: bool = True,
                      shards: int = 1, **shape) -> Path:
    """Write a random tiny ``family`` checkpoint (raw HF layout) with a tokenizer."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out)
    cfg = tiny_config(family, **shape)
    cfg.update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
               bos_token_id=None)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [ids["<|im_end|>"]], "do_sample": False}))
    save_sharded(out, tiny_family_weights(cfg, seed=seed, with_mtp=with_mtp), shards=shards)
    return out


# Small realistic shapes for ``engine bench --replay`` on this CPU (a GLM-4.5-Air / DeepSeek-V3
# layer scaled down: the same kinds of blocks, 16 experts, a 32k vocabulary; ~0.3 B params).
BENCH_SHAPES = {
    "glm4_moe": dict(vocab_size=32768, hidden=1024, layers=8, intermediate_size=2816,
                     moe_intermediate_size=512, n_routed_experts=16, num_experts_per_tok=4,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=128),
    "deepseek_v3": dict(vocab_size=32768, hidden=1024, layers=8, intermediate_size=2816,
                        moe_intermediate_size=512, n_routed_experts=16, num_experts_per_tok=4,
                        num_attention_heads=8, num_key_value_heads=8, q_lora_rank=384,
                        kv_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64,
                        v_head_dim=64, n_group=4, topk_group=2),
}
BENCH_SHAPES["glm4_moe_lite"] = dict(BENCH_SHAPES["deepseek_v3"], n_group=1, topk_group=1)
# Qwen3-Next-80B-A3B scaled down: 6 GDN + 2 gated-attention layers, all MoE (16 experts top 4
# + a gated shared expert), 8 key / 16 value GDN heads of 128, 8 query / 2 KV heads of 128.
BENCH_SHAPES["qwen3_next"] = dict(vocab_size=32768, hidden=1024, layers=8,
                                  intermediate_size=2816, moe_intermediate_size=512,
                                  num_experts=16, num_experts_per_tok=4,
                                  shared_expert_intermediate_size=512, mlp_only_layers=[],
                                  num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                                  linear_num_key_heads=8, linear_num_value_heads=16,
                                  linear_key_head_dim=128, linear_value_head_dim=128)


if __name__ == "__main__":
    import sys

    print(build_tiny_family(sys.argv[2], sys.argv[1], **BENCH_SHAPES[sys.argv[1]]))
