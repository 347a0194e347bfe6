"""Tiny random Qwen3.5-architecture models written in the real on-disk layouts.

``build_tiny_model`` writes what Qwen publishes (raw Hugging Face layout: zero-centred norms,
raw ``[C, 1, K]`` conv1d, ``model.language_model.*`` + ``mtp.*`` keys, nested ``text_config``)
or the text-only ``Qwen3_5ForCausalLM`` layout, with a small byte-level BPE tokenizer and a
Qwen-style chat template. Weights are drawn with numpy from a seed, scaled so that logits are
well spread (greedy near-ties are rare), and saved as safetensors only.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
OUT_GAIN = 4.0  # residual updates dominate the tied embedding: varied outputs
_TEXT = (
    "The quick brown fox jumps over the lazy dog. json.dumps serializes an object to a JSON "
    "formatted string. os.path.join joins one or more path components intelligently. "
    "def hello(name): return f'hello {name}'\n"
) * 20


@functools.lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT], trainer=trainer)
    return tok.to_str()


def write_tokenizer(out: Path, *, vocab_size: int = 320) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(_tokenizer_json(vocab_size), encoding="utf-8")
    ids = {t: json.loads(_tokenizer_json(vocab_size))["model"]["vocab"].get(t) for t in SPECIALS}
    added = json.loads(_tokenizer_json(vocab_size))["added_tokens"]
    ids = {a["content"]: a["id"] for a in added}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "model_max_length": 4096, "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": c, "special": True} for c, i in ids.items()},
    }, indent=1), encoding="utf-8")
    return ids


def tiny_text_config(*, moe: bool = False, tied: bool = True, vocab_size: int = 384,
                     hidden: int = 64, layers: int = 4) -> dict:
    cfg = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                        for i in range(layers)],
        "tie_word_embeddings": tied, "attention_bias": False, "hidden_act": "silu",
        "mtp_num_hidden_layers": 1, "dtype": "float32",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                            "mrope_interleaved": True},
    }
    if moe:
        cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden,
                   shared_expert_intermediate_size=hidden, decoder_sparse_step=1,
                   norm_topk_prob=True)
    return cfg


def _normal(rng, shape, scale) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def _layer_tensors(rng, cfg: dict, prefix: str, *, linear: bool, moe: bool,
                   per_expert: bool = False) -> dict[str, np.ndarray]:
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    t: dict[str, np.ndarray] = {}

    def lin(name, out_dim, in_dim, gain=1.0):
        t[f"{prefix}.{name}"] = _normal(rng, (out_dim, in_dim), gain / np.sqrt(in_dim))

    def znorm(name, dim):  # zero-centred RMSNorm weight: scale = 1 + w
        t[f"{prefix}.{name}"] = (0.1 * rng.standard_normal(dim)).astype(np.float32)

    znorm("input_layernorm.weight", H)
    znorm("post_attention_layernorm.weight", H)
    if linear:
        hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
        conv_dim = 2 * hk * dk + hv * dv
        lin("linear_attn.in_proj_qkv.weight", conv_dim, H)
        lin("linear_attn.in_proj_z.weight", hv * dv, H)
        lin("linear_attn.in_proj_b.weight", hv, H)
        lin("linear_attn.in_proj_a.weight", hv, H)
        lin("linear_attn.out_proj.weight", H, hv * dv, OUT_GAIN)
        t[f"{prefix}.linear_attn.conv1d.weight"] = (0.5 * rng.standard_normal((conv_dim, 1, K))).astype(np.float32)
        t[f"{prefix}.linear_attn.dt_bias"] = rng.uniform(0.5, 1.5, hv).astype(np.float32)
        t[f"{prefix}.linear_attn.A_log"] = np.log(rng.uniform(1, 8, hv)).astype(np.float32)
        t[f"{prefix}.linear_attn.norm.weight"] = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    else:
        nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        lin("self_attn.q_proj.weight", 2 * nq * hd, H)
        lin("self_attn.k_proj.weight", nkv * hd, H)
        lin("self_attn.v_proj.weight", nkv * hd, H)
        lin("self_attn.o_proj.weight", H, nq * hd, OUT_GAIN)
        znorm("self_attn.q_norm.weight", hd)
        znorm("self_attn.k_norm.weight", hd)
    if moe:
        E, MI, SI = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        lin("mlp.gate.weight", E, H)
        gate_up = (rng.standard_normal((E, 2 * MI, H)) / np.sqrt(H)).astype(np.float32)
        down = (rng.standard_normal((E, H, MI)) / np.sqrt(MI)).astype(np.float32)
        if per_expert:
            for e in range(E):
                t[f"{prefix}.mlp.experts.{e}.gate_proj.weight"] = gate_up[e, :MI]
                t[f"{prefix}.mlp.experts.{e}.up_proj.weight"] = gate_up[e, MI:]
                t[f"{prefix}.mlp.experts.{e}.down_proj.weight"] = down[e]
        else:
            t[f"{prefix}.mlp.experts.gate_up_proj"] = gate_up
            t[f"{prefix}.mlp.experts.down_proj"] = down
        lin("mlp.shared_expert.gate_proj.weight", SI, H)
        lin("mlp.shared_expert.up_proj.weight", SI, H)
        lin("mlp.shared_expert.down_proj.weight", H, SI)
        lin("mlp.shared_expert_gate.weight", 1, H)
    else:
        lin("mlp.gate_proj.weight", I, H)
        lin("mlp.up_proj.weight", I, H)
        lin("mlp.down_proj.weight", H, I, OUT_GAIN)
    return t


def tiny_weights(cfg: dict, *, seed: int = 0, with_mtp: bool = True,
                 prefix: str = "model.language_model") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    moe = cfg.get("num_experts", 0) > 0
    w: dict[str, np.ndarray] = {
        f"{prefix}.embed_tokens.weight": _normal(rng, (V, H), 1.0),
        f"{prefix}.norm.weight": (0.1 * rng.standard_normal(H)).astype(np.float32),
    }
    for i in range(cfg["num_hidden_layers"]):
        linear = (i + 1) % cfg["full_attention_interval"] != 0
        w.update(_layer_tensors(rng, cfg, f"{prefix}.layers.{i}", linear=linear, moe=moe))
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = (rng.standard_normal((V, H)) / np.sqrt(H) * 4).astype(np.float32)
    if with_mtp:
        w["mtp.fc.weight"] = (rng.standard_normal((H, 2 * H)) / np.sqrt(2 * H)).astype(np.float32)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            w[f"mtp.{n}.weight"] = (0.1 * rng.standard_normal(H)).astype(np.float32)
        w.update(_layer_tensors(rng, cfg, "mtp.layers.0", linear=False, moe=moe, per_expert=True))
    return w


def save_sharded(out: Path, weights: dict[str, np.ndarray], *, shards: int = 1) -> None:
    names = sorted(weights)
    if shards == 1:
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    index = {"metadata": {"total_size": int(sum(v.nbytes for v in weights.values()))},
             "weight_map": {}}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[s::shards]}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        index["weight_map"].update({n: fname for n in part})
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def build_tiny_model(out: str | Path, *, layout: str = "hf", moe: bool = False,
                     tied: bool = True, with_mtp: bool = True, seed: int = 0,
                     shards: int = 1, vocab_size: int = 384, hidden: int = 64,
                     layers: int = 4) -> Path:
    """Write a random tiny model. ``layout``: "hf" (ConditionalGeneration) or "causal"."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out)
    text = tiny_text_config(moe=moe, tied=tied, vocab_size=vocab_size, hidden=hidden, layers=layers)
    text.update(eos_token_id=ids["<|im_end|>"], bos_token_id=None, pad_token_id=ids["<|endoftext|>"])
    if layout == "hf":
        arch = "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
        config = {"architectures": [arch], "model_type": "qwen3_5_moe" if moe else "qwen3_5",
                  "text_config": text, "tie_word_embeddings": tied,
                  "vision_config": {"depth": 1, "hidden_size": 32},
                  "image_token_id": vocab_size - 1, "video_token_id": vocab_size - 2}
        weights = tiny_weights(text, seed=seed, with_mtp=with_mtp)
        rng = np.random.default_rng(seed + 1)  # a vision tensor the engine must ignore
        weights["model.visual.patch_embed.proj.weight"] = rng.standard_normal((8, 3)).astype(np.float32)
    elif layout == "causal":
        arch = "Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"
        config = dict(text, architectures=[arch])
        weights = tiny_weights(text, seed=seed, with_mtp=with_mtp, prefix="model")
    else:
        raise ValueError(layout)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "do_sample": False}))
    save_sharded(out, weights, shards=shards)
    return out


QWEN35_08B = dict(vocab_size=248320, hidden=1024, layers=24)


def qwen35_08b_text_config() -> dict:
    """Qwen3.5-0.8B's text shape (MTP_SPEC §1) for random-weight speed measurements."""
    cfg = tiny_text_config(vocab_size=248320, hidden=1024, layers=24)
    cfg.update(intermediate_size=3584, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
               linear_num_value_heads=16, linear_num_key_heads=16, linear_key_head_dim=128,
               linear_value_head_dim=128, max_position_embeddings=32768)
    cfg["rope_parameters"] = dict(cfg["rope_parameters"], rope_theta=1e7, mrope_section=[11, 11, 10])
    return cfg


def build_qwen35_08b_shaped(out: str | Path, *, seed: int = 0) -> Path:
    """A random model with Qwen3.5-0.8B's exact shapes in float32 (about 3.4 GB)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out)
    text = qwen35_08b_text_config()
    text.update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "text_config": text, "tie_word_embeddings": True}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_sharded(out, tiny_weights(text, seed=seed, with_mtp=True), shards=4)
    return out


if __name__ == "__main__":
    import sys

    print(build_qwen35_08b_shaped(sys.argv[1]))
