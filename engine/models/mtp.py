"""The Qwen3.5/3.6 multi-token-prediction head (MTP_SPEC §2), on top of mlx-lm's trunk classes.

For a pair (trunk hidden h_t after the final norm, next token x_{t+1}) rotated at position t:
    e = pre_fc_norm_embedding(embed(x_{t+1}));  h = pre_fc_norm_hidden(h_t)
    z = fc(concat([e, h]))            # embedding first, hidden second
    z = one full-attention decoder layer(z)   (own KV cache, one row per pair)
    out = norm(z)                     # fed to the trunk's LM head; predicts x_{t+2}
Depth > 1 feeds ``out`` (after ``norm``) back as the hidden with the drafted token.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

from engine.models import device
from engine.models.trunk import attention_layer, compiled_on

# Norm weights that checkpoints store zero-centred (scale = 1 + w).
MTP_NORM_SUFFIXES = (
    "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "mtp.norm.weight",
    ".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
    ".k_norm.weight",
)


def gated_attention_layer(args: TextModelArgs):
    """Qwen3.5's MTP layer: mlx-lm's decoder layer as its gated full-attention variant
    (layer_idx = interval - 1)."""
    return DecoderLayer(args, layer_idx=args.full_attention_interval - 1)


class MTPHead(nn.Module):
    """``layer(args)`` builds one MTP decoder layer (Qwen3.5's by default; Qwen3-Next passes
    its own gated-attention MoE layer: the head's wiring is the same)."""

    def __init__(self, args: TextModelArgs, num_layers: int = 1,
                 layer=gated_attention_layer) -> None:
        super().__init__()
        h = args.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.layers = [layer(args) for _ in range(num_layers)]
        self.norm = nn.RMSNorm(h, eps=args.rms_norm_eps)

    def __call__(self, hidden: mx.array, token_embeds: mx.array, cache: list[KVCache],
                 at: mx.array | None = None) -> mx.array:
        """hidden, token_embeds: [B, S, H] -> normed MTP hidden [B, S, H]; with ``at`` [B]
        only position ``at[b]`` of each row [B, 1, H] (every pair still enters the cache; a
        one-layer head then runs its attention and MLP for that position alone:
        ``trunk.attention_layer``). The device branch (engine/models/device.py) is read once,
        here."""
        cpu = device.is_cpu()
        z = self._fc(hidden, token_embeds, cpu)
        mask = create_attention_mask(z, cache[0])
        last = len(self.layers) - 1
        for i, (layer, c) in enumerate(zip(self.layers, cache)):  # mlx-lm's layers, in parts
            z = attention_layer(layer, z, mask, c, cpu, at=at if i == last else None)
        if not cpu:
            return self.norm(z)
        # compiled: 3 graph nodes instead of 11 (MLX's RMSNorm is composed of ops on the CPU)
        return compiled_on(self, "_mtpchat_norm", self.norm, [self.norm.state])(z)

    def _fc(self, hidden: mx.array, token_embeds: mx.array, cpu: bool | None = None,
            ) -> mx.array:
        """The two norms, the concatenation and ``fc``: one ``mx.compile``d function on the
        CPU branch (the same operations: bit-identical, tested; its weights are compile
        inputs)."""
        def fc(hidden, token_embeds):
            return self.fc(mx.concatenate([self.pre_fc_norm_embedding(token_embeds),
                                           self.pre_fc_norm_hidden(hidden)], axis=-1))
        if not (device.is_cpu() if cpu is None else cpu):
            return fc(hidden, token_embeds)
        return compiled_on(self, "_mtpchat_fc", fc, [
            self.fc.state, self.pre_fc_norm_embedding.state, self.pre_fc_norm_hidden.state,
        ])(hidden, token_embeds)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def kv_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(heads, dim) of one cache row's keys and of its values."""
        attn = self.layers[0].self_attn
        return (attn.num_key_value_heads, attn.head_dim), (attn.num_key_value_heads,
                                                            attn.head_dim)


def sanitize_mtp(weights: dict[str, mx.array], *, shift_norms: bool) -> dict[str, mx.array]:
    """Map ``mtp.*`` checkpoint tensors to MTPHead parameter names (without the prefix).

    ``shift_norms`` adds the +1 of zero-centred norms; pass True exactly when the trunk is in
    raw HF layout (the same rule mlx-lm applies to the trunk), so the shift happens once.
    """
    out: dict[str, mx.array] = {}
    experts: dict[tuple[str, int, str], mx.array] = {}
    for key, value in weights.items():
        if not key.startswith("mtp."):
            continue
        parts = key.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            prefix = ".".join(parts[1:i])
            experts[(prefix, int(parts[i + 1]), parts[i + 2])] = value
            continue
        if shift_norms and value.ndim == 1 and any(key.endswith(s) for s in MTP_NORM_SUFFIXES):
            value = value + 1.0
        name = key[len("mtp."):]
        if name.endswith("mlp.experts.gate_up_proj"):
            mid = value.shape[-2] // 2
            base = name[: -len("experts.gate_up_proj")]
            out[base + "switch_mlp.gate_proj.weight"] = value[..., :mid, :]
            out[base + "switch_mlp.up_proj.weight"] = value[..., mid:, :]
            continue
        if name.endswith("mlp.experts.down_proj"):
            out[name[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"] = value
            continue
        out[name] = value
    prefixes = sorted({(p, proj) for p, _, proj in experts})
    for prefix, proj in prefixes:
        n = 1 + max(e for p, e, pr in experts if p == prefix and pr == proj)
        stacked = mx.stack([experts[(prefix, e, proj)] for e in range(n)])
        out[f"{prefix}.switch_mlp.{proj}.weight"] = stacked
    return out
