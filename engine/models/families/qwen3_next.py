"""Qwen3-Next (``qwen3_next``, Qwen3-Next-80B-A3B): mlx-lm's ``qwen3_next`` trunk (Gated
DeltaNet and gated attention, 3:1, every layer MoE with a gated shared expert) and an MTP
head wired as Qwen3.5's (``mtp.*``: ``fc`` over the two normed inputs, embedding first, one
gated-attention MoE decoder layer, ``mtp.norm``, zero-centred norms; docs/families.md has
the sources).

What differs from Qwen3.5 is the GDN's input projections: Qwen3-Next fuses them into
``in_proj_qkvz`` and ``in_proj_ba``, interleaved per key head (for each key head: its q, its
k, then the v and z of its value heads; b and a likewise). ``fused_projections`` undoes that
with mlx-lm's own ``fix_query_key_value_ordering`` (what plain decoding runs), and the verify
forward, its per-step capture and the recurrence are Qwen3.5's (``engine.models.trunk``).
"""
from __future__ import annotations

import mlx.core as mx

from engine.errors import ModelLoadError
from engine.models import trunk as trunk_ops
from engine.models.families.nextn import check_expert_shapes
from engine.models.families.qwen3_5 import Qwen35


def fused_projections(gdn, x: mx.array) -> tuple[mx.array, ...]:
    """Qwen3-Next's fused, per-key-head interleaved projections -> (q|k|v [B, S, conv_dim],
    z [B, S, Hv, Dv], b [B, S, Hv], a [B, S, Hv]), as ``trunk.split_projections`` returns
    them for Qwen3.5."""
    B, S, _ = x.shape
    q, k, v, z, b, a = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(x), gdn.in_proj_ba(x))
    qkv = mx.concatenate([q.reshape(B, S, -1), k.reshape(B, S, -1), v.reshape(B, S, -1)], -1)
    return qkv, z, b, a


class Qwen3Next(Qwen35):
    stack_experts = False  # mlx-lm's qwen3_next sanitize stacks them and shifts the norms

    def build(self, cfg, weights: dict):
        check_head_layers(cfg, weights)
        check_expert_shapes(weights)
        return super().build(cfg, weights)

    def build_trunk(self, cfg):
        from mlx_lm.models import qwen3_next

        return qwen3_next.Model(self.head_args(cfg))

    def text_model(self, trunk):
        return trunk

    def forward_hidden(self, text_model, inputs, cache: list, *, capture: bool = False,
                       mark: int | None = None):
        return trunk_ops.forward_hidden(text_model, inputs, cache, capture=capture,
                                        project=fused_projections, mark=mark)

    def head_args(self, cfg):
        from mlx_lm.models import qwen3_next

        text = dict(cfg.text)
        text.setdefault("model_type", "qwen3_next")
        return qwen3_next.ModelArgs.from_dict(text)

    def head_layer(self, cfg, mtp_raw: dict):
        return head_layer


def head_layer(args):
    """The MTP layer: mlx-lm's ``Qwen3NextDecoderLayer`` as its gated full-attention variant
    (built at index ``interval - 1``), its MLP by transformers' rule at index 0 (``mtp.layers.0``:
    MoE unless 0 is in ``mlp_only_layers``; the published checkpoints' head is MoE)."""
    from mlx_lm.models import qwen3_next

    layer = qwen3_next.Qwen3NextDecoderLayer(args, args.full_attention_interval - 1)
    moe = 0 not in args.mlp_only_layers and args.num_experts > 0 \
        and 1 % args.decoder_sparse_step == 0
    layer.mlp = qwen3_next.Qwen3NextSparseMoeBlock(args) if moe else \
        qwen3_next.Qwen3NextMLP(args.hidden_size, args.intermediate_size)
    return layer


def check_head_layers(cfg, weights) -> None:
    """The MTP layer count config.json declares (``mtp_num_hidden_layers`` or
    ``num_nextn_predict_layers``) against the ``mtp.layers.N`` the checkpoint holds."""
    parts = [k.split(".") for k in weights if k.startswith("mtp.layers.")]
    stored = sorted({int(p[2]) for p in parts if len(p) > 3 and p[2].isdigit()})
    has_head = any(k.startswith("mtp.") for k in weights)
    keys = [k for k in ("mtp_num_hidden_layers", "num_nextn_predict_layers")
            if cfg.text.get(k) is not None]
    if not has_head:
        return
    if not stored:
        raise ModelLoadError("The checkpoint holds mtp.* tensors but no MTP decoder layer "
                             "(mtp.layers.0.*): it is incomplete. Re-download the model.")
    if keys and int(cfg.text[keys[0]]) != len(stored):
        raise ModelLoadError(
            f"config.json says {keys[0]} is {cfg.text[keys[0]]} but the checkpoint holds "
            f"{len(stored)} MTP layer(s) (mtp.layers.{stored[0]}..{stored[-1]}); fix the "
            "config or re-download the model.")
    if stored != list(range(len(stored))):
        raise ModelLoadError(f"The MTP layers are numbered {stored}, not 0..{len(stored) - 1}:"
                             " the checkpoint is incomplete. Re-download the model.")


def family(name: str) -> Qwen3Next:
    return Qwen3Next(name)
