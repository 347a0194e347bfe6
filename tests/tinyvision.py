"""A tiny random Qwen3.5 checkpoint WITH its vision tower, in the raw layout Qwen publishes.

``build_tiny_vision_model(out)`` makes transformers' own ``Qwen3_5ForConditionalGeneration``
(float32) from a small config (2 vision blocks, 8-pixel patches, a 64-wide trunk whose M-RoPE
sections [2, 1, 1] use all three axes), puts in the text weights of ``tests.tinymodels`` (well
spread logits) and random vision weights scaled so image embeddings are O(1) (an image moves
the output), and saves its state dict as safetensors (``model.language_model.*``,
``model.visual.*``, ``mtp.*``), with a tokenizer holding Qwen's vision tokens and a chat
template that renders image parts as ``<|vision_start|><|image_pad|><|vision_end|>``.
``hf_model(folder)`` loads it back into transformers: the reference for the parity tests.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.tinymodels import tiny_text_config, tiny_weights

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
            "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item.type == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item.type == 'text' %}{{- item.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
VISION = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
          "in_channels": 3, "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
          "out_hidden_size": 64, "num_position_embeddings": 64,
          "hidden_act": "gelu_pytorch_tanh", "model_type": "qwen3_5_vision"}
_TEXT = ("Describe the picture. The quick brown fox jumps over the lazy dog. What is in this "
         "image? A red square on a blue field, two cats and a window.\n") * 20


def write_tokenizer(out: Path, vocab_size: int = 320) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT], trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "bos_token": None, "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": c, "special": True}
                                 for c, i in ids.items()}}, indent=1), encoding="utf-8")
    return ids


def vision_text_config(vocab_size: int = 384) -> dict:
    text = tiny_text_config(vocab_size=vocab_size)
    text["rope_parameters"] = dict(text["rope_parameters"], partial_rotary_factor=0.5,
                                   mrope_section=[2, 1, 1])
    return text


def _vision_weights(model, seed: int) -> dict:
    """Random vision weights, scaled per tensor so activations stay O(1)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.model.visual.named_parameters():
        shape = tuple(p.shape)
        if name.endswith("bias"):
            v = 0.02 * torch.randn(shape, generator=g)
        elif "norm" in name:
            v = 1 + 0.1 * torch.randn(shape, generator=g)
        elif name == "pos_embed.weight":
            v = 0.5 * torch.randn(shape, generator=g)
        else:
            fan_in = int(np.prod(shape[1:]))
            v = torch.randn(shape, generator=g) / fan_in ** 0.5
        out[f"model.visual.{name}"] = v.float().contiguous()
    return out


def build_tiny_vision_model(out: str | Path, *, seed: int = 0, with_mtp: bool = True) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    out = Path(out)
    ids = write_tokenizer(out)
    text = vision_text_config()
    text.update(eos_token_id=ids["<|im_end|>"], bos_token_id=None,
                pad_token_id=ids["<|endoftext|>"])
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "text_config": text, "vision_config": dict(VISION), "tie_word_embeddings": True,
              "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
              "vision_start_token_id": ids["<|vision_start|>"],
              "vision_end_token_id": ids["<|vision_end|>"]}
    torch.manual_seed(seed)
    hf = Qwen3_5ForConditionalGeneration(_hf_config(Qwen3_5Config, config)).float()
    state = {k: torch.from_numpy(np.ascontiguousarray(v))
             for k, v in tiny_weights(text, seed=seed, with_mtp=with_mtp).items()}
    state.update(_vision_weights(hf, seed + 1))
    hf.load_state_dict({k: v for k, v in state.items() if not k.startswith("mtp.")} |
                       {"lm_head.weight": state["model.language_model.embed_tokens.weight"]},
                       strict=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "do_sample": False}))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "size": {"shortest_edge": 16 * 16 * 4, "longest_edge": 16 * 16 * 64},
        "patch_size": 8, "merge_size": 2, "temporal_patch_size": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _hf_config(cls, config: dict):
    text = {k: v for k, v in config["text_config"].items()
            if k not in ("model_type", "architectures", "dtype")}
    vision = {k: v for k, v in config["vision_config"].items() if k != "model_type"}
    cfg = cls(text_config=text, vision_config=vision,
              **{k: config[k] for k in ("image_token_id", "video_token_id",
                                        "vision_start_token_id", "vision_end_token_id",
                                        "tie_word_embeddings")})
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    return cfg


def hf_model(folder: Path):
    """transformers' model holding the checkpoint's tensors (strict), float32, eval."""
    import torch
    from safetensors.torch import load_file
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    config = json.loads((folder / "config.json").read_text())
    model = Qwen3_5ForConditionalGeneration(_hf_config(Qwen3_5Config, config))
    state = {k: v for k, v in load_file(str(folder / "model.safetensors")).items()
             if not k.startswith("mtp.")}
    state["lm_head.weight"] = state["model.language_model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.float().eval().to(torch.float32)


def hf_greedy(model, ids: list[int], image_token: int, patches: list[np.ndarray],
              grids: list[tuple[int, int, int]], n: int) -> list[int]:
    """transformers' greedy continuation of ``ids`` (each step a full forward, no cache)."""
    import torch

    seq = list(ids)
    kw = {}
    if patches:
        kw = dict(pixel_values=torch.from_numpy(np.concatenate(patches)),
                  image_grid_thw=torch.tensor(grids))
    out = []
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([seq])
            kw["mm_token_type_ids"] = (x == image_token).int()
            logits = model(input_ids=x, **kw).logits[0, -1]
            t = int(logits.argmax())
            out.append(t)
            seq.append(t)
    return out


def hf_image_embeds(model, patches: list[np.ndarray], grids) -> np.ndarray:
    import torch

    with torch.no_grad():
        got = model.model.get_image_features(torch.from_numpy(np.concatenate(patches)),
                                             torch.tensor(grids))
    return torch.cat(got.pooler_output).numpy()


def sample_image(h: int, w: int, seed: int) -> np.ndarray:
    """A deterministic RGB image with structure (gradients and blocks), uint8."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(1, w - 1)), (y * 255 // max(1, h - 1)),
                    ((x // 7 + y // 5) % 2) * 200], axis=-1).astype(np.int64)
    img += rng.integers(0, 40, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)
