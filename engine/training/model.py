"""The demo model in torch: transformers' own Qwen3.5 text trunk plus an MTP head (MTP_SPEC §2).

The trunk is ``transformers.Qwen3_5ForCausalLM`` (Gated DeltaNet layers, gated full attention
every ``full_attention_interval``-th layer, zero-centred RMSNorms, tied embeddings). The MTP
head reuses transformers' ``Qwen3_5DecoderLayer`` (built as a full-attention layer) for its one
layer, so its weights and numerics are the trunk's own, but runs it with its own forward so the
recursive draft chain can attend to the right key/value rows:

- step 1 for the pair (h_t, x_{t+1}): ``z = fc(cat([norm_emb(embed(x_{t+1})), norm_hid(h_t)]))``
  at rotary position t, attending to the step-1 rows of positions <= t (one MTP KV row per
  committed pair, MTP_SPEC §3); output ``g = mtp.norm(layer(z))``, logits ``embed^T g``
  predict x_{t+2}.
- step s >= 2 of the chain started at t: the pair (g from step s-1, token x_{t+s}) at position
  t+s-1, attending to the step-1 rows of positions <= t and to the chain's own earlier rows.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5DecoderLayer,
    Qwen3_5ForCausalLM,
    Qwen3_5RMSNorm,
    apply_rotary_pos_emb,
    repeat_kv,
)


@dataclass(frozen=True)
class ModelSize:
    """Sizes of a Qwen3.5-style text model (a miniature of Qwen3.5-0.8B by default)."""

    hidden_size: int = 192
    num_hidden_layers: int = 8
    intermediate_size: int = 512
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 4
    linear_key_head_dim: int = 32
    linear_num_value_heads: int = 8
    linear_value_head_dim: int = 32
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4
    max_position_embeddings: int = 8192
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6

    def as_dict(self) -> dict:
        return asdict(self)


FULL_SIZE = ModelSize()
TINY_SIZE = ModelSize(
    hidden_size=64, num_hidden_layers=4, intermediate_size=128, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_key_head_dim=32,
    linear_num_value_heads=4, linear_value_head_dim=16)


def mrope_section(size: ModelSize) -> list[int]:
    """Split the rotary frequencies in three like Qwen's ``[11, 11, 10]`` (text uses one position)."""
    n = int(size.head_dim * size.partial_rotary_factor) // 2
    a = math.ceil(n / 3)
    b = math.ceil((n - a) / 2)
    return [a, b, n - a - b]


def rope_parameters(size: ModelSize) -> dict:
    return {
        "mrope_interleaved": True,
        "mrope_section": mrope_section(size),
        "partial_rotary_factor": size.partial_rotary_factor,
        "rope_theta": size.rope_theta,
        "rope_type": "default",
    }


def layer_types(size: ModelSize) -> list[str]:
    k = size.full_attention_interval
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention"
            for i in range(size.num_hidden_layers)]


def text_config(size: ModelSize, *, vocab_size: int, eos_token_id: int,
                pad_token_id: int | None = None) -> Qwen3_5TextConfig:
    """transformers' text config for ``size`` (sdpa attention, tied embeddings)."""
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size, num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_key_value_heads, head_dim=size.head_dim,
        linear_conv_kernel_dim=size.linear_conv_kernel_dim,
        linear_key_head_dim=size.linear_key_head_dim,
        linear_num_key_heads=size.linear_num_key_heads,
        linear_value_head_dim=size.linear_value_head_dim,
        linear_num_value_heads=size.linear_num_value_heads,
        max_position_embeddings=size.max_position_embeddings, rms_norm_eps=size.rms_norm_eps,
        tie_word_embeddings=True, rope_parameters=rope_parameters(size),
        layer_types=layer_types(size), eos_token_id=eos_token_id, pad_token_id=pad_token_id,
        use_cache=False)
    cfg._attn_implementation = "sdpa"
    return cfg


class MTPHead(nn.Module):
    """One MTP layer with the parameter names of Qwen's ``mtp.*`` tensors."""

    def __init__(self, config: Qwen3_5TextConfig):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
        full_idx = config.layer_types.index("full_attention")
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, full_idx)])
        self.norm = Qwen3_5RMSNorm(h, eps=eps)

    def init_weights(self, std: float) -> None:
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, mean=0.0, std=std)
            elif isinstance(mod, Qwen3_5RMSNorm):
                nn.init.zeros_(mod.weight)

    def layer_forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      past: tuple[torch.Tensor, torch.Tensor] | None,
                      mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder layer on new rows ``x`` [B, n, H]; keys = past rows + these rows.

        ``mask`` [n, n_past + n] is True where a query row may attend. Returns (output, all keys,
        all values) with keys/values [B, kv_heads, n_past + n, head_dim] (rotated keys).
        """
        layer = self.layers[0]
        attn = layer.self_attn
        b, n, _ = x.shape
        hd = attn.head_dim
        h = layer.input_layernorm(x)
        q, gate = torch.chunk(attn.q_proj(h).view(b, n, -1, 2 * hd), 2, dim=-1)
        gate = gate.reshape(b, n, -1)
        q = attn.q_norm(q).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(b, n, -1, hd)).transpose(1, 2)
        v = attn.v_proj(h).view(b, n, -1, hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        groups = attn.num_key_value_groups
        out = F.scaled_dot_product_attention(
            q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=mask, scale=attn.scaling)
        out = out.transpose(1, 2).reshape(b, n, -1) * torch.sigmoid(gate)
        x = x + attn.o_proj(out)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, k, v


def _chain_mask(lengths: list[int], device: torch.device) -> torch.Tensor:
    """Attention mask for step s = len(lengths) of the draft chains.

    Keys are the rows of steps 1..s (step j has ``lengths[j-1]`` rows, row t = chain started
    at t). Query row t of step s sees step-1 rows 0..t and row t of every later step.
    """
    n = lengths[-1]
    rows = torch.arange(n, device=device)[:, None]
    blocks = [torch.arange(lengths[0], device=device)[None, :] <= rows]
    for length in lengths[1:]:
        blocks.append(torch.arange(length, device=device)[None, :] == rows)
    return torch.cat(blocks, dim=1)


class DemoModel(nn.Module):
    """Trunk (``Qwen3_5ForCausalLM``) + MTP head; float32, CPU."""

    def __init__(self, config: Qwen3_5TextConfig):
        super().__init__()
        self.config = config
        self.trunk = Qwen3_5ForCausalLM(config)
        self.mtp = MTPHead(config)
        self.mtp.init_weights(config.initializer_range)

    @property
    def embed(self) -> nn.Embedding:
        return self.trunk.model.embed_tokens

    def trunk_forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden after the final norm [B, L, H], logits [B, L, V]) for token ids [B, L]."""
        hidden = self.trunk.model(input_ids=ids, use_cache=False).last_hidden_state
        return hidden, self.trunk.lm_head(hidden)

    def mtp_chains(self, hidden: torch.Tensor, ids: torch.Tensor, depth: int, *,
                   feed_drafts: bool = False) -> list[torch.Tensor]:
        """MTP logits for every draft chain, steps 1..depth.

        ``hidden`` [B, L, H] are trunk hiddens after the final norm for tokens ``ids`` [B, L].
        Returns a list whose entry s-1 is [B, L-s, V]: row t is step s of the chain started at
        the pair (h_t, x_{t+1}) and predicts x_{t+s+1}. Step s >= 2 is fed the token x_{t+s}
        (teacher forcing) or, with ``feed_drafts``, the argmax drafted at step s-1.
        """
        b, length, _ = hidden.shape
        rotary = self.trunk.model.rotary_emb
        lengths: list[int] = []
        past = None
        prev_g = prev_draft = None
        out: list[torch.Tensor] = []
        for step in range(1, depth + 1):
            n = length - step
            if n <= 0:
                break
            if step == 1:
                tok, hid = ids[:, 1:], hidden[:, :-1]
            else:
                tok = prev_draft[:, :n] if feed_drafts else ids[:, step:]
                hid = prev_g[:, :n]
            e = self.mtp.pre_fc_norm_embedding(self.embed(tok))
            z = self.mtp.fc(torch.cat([e, self.mtp.pre_fc_norm_hidden(hid)], dim=-1))
            pos = (torch.arange(n, device=ids.device) + step - 1)[None, :]
            cos, sin = rotary(z, pos)
            lengths.append(n)
            mask = _chain_mask(lengths, ids.device)
            x, k, v = self.mtp.layer_forward(z, cos, sin, past, mask)
            past = (k, v)
            prev_g = self.mtp.norm(x)
            logits = F.linear(prev_g, self.embed.weight)
            prev_draft = logits.argmax(-1)
            out.append(logits)
        return out


def build_model(size: ModelSize, *, vocab_size: int, eos_token_id: int, seed: int,
                pad_token_id: int | None = None) -> DemoModel:
    """A freshly initialised model; deterministic given ``seed``."""
    torch.manual_seed(seed)
    cfg = text_config(size, vocab_size=vocab_size, eos_token_id=eos_token_id,
                      pad_token_id=pad_token_id)
    return DemoModel(cfg)


def count_parameters(model: DemoModel) -> dict[str, int]:
    """Unique parameter counts: trunk (embedding counted once, tied) and MTP head."""
    trunk = sum(p.numel() for p in {id(p): p for p in model.trunk.parameters()}.values())
    mtp = sum(p.numel() for p in model.mtp.parameters())
    return {"trunk": trunk, "mtp": mtp, "total": trunk + mtp}
