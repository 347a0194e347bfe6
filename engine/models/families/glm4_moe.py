"""GLM-4.5 / 4.5-Air / 4.6 / 4.7 (``glm4_moe``): mlx-lm's ``glm4_moe`` trunk (grouped-query
attention with partial RoPE, dense first layers then MoE with a shared expert and a sigmoid
router), one nextn MTP layer stored as ``model.layers.{num_hidden_layers}``
(``engine.models.families.nextn``; facts and sources in docs/families.md).
"""
from __future__ import annotations

from mlx_lm.models import glm4_moe

from engine.models.families.nextn import NextNFamily


class Glm4Moe(NextNFamily):
    module = glm4_moe

    def layer(self, args, index: int):
        return glm4_moe.DecoderLayer(args, index)

    def kv_shapes(self, args):
        return (args.num_key_value_heads, args.head_dim), (args.num_key_value_heads,
                                                          args.head_dim)


def family(name: str) -> Glm4Moe:
    return Glm4Moe(name)
