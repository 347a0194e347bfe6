"""GLM-4.7-Flash (``glm4_moe_lite``): mlx-lm's ``glm4_moe_lite`` trunk, DeepSeek-V3's design
at a smaller size (multi-head latent attention, dense first layer then MoE with a shared expert
and a sigmoid router), one nextn MTP layer stored as ``model.layers.{num_hidden_layers}`` (47;
``engine.models.families.nextn``; facts and sources in docs/families.md).
"""
from __future__ import annotations

from mlx_lm.models import glm4_moe_lite

from engine.models.families.nextn import MLANextNFamily


class Glm4MoeLite(MLANextNFamily):
    module = glm4_moe_lite

    def layer(self, args, index: int):
        return glm4_moe_lite.Glm4MoeLiteDecoderLayer(args, index)


def family(name: str) -> Glm4MoeLite:
    return Glm4MoeLite(name)
