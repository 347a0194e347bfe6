"""DeepSeek-V3 / V3.1 (``deepseek_v3``): mlx-lm's ``deepseek_v3`` trunk (multi-head latent
attention, whose cache holds the compressed KV latent and the rotary key part; dense first
layers then MoE with shared experts and a grouped sigmoid router), one nextn MTP layer stored
as ``model.layers.{num_hidden_layers}`` (61 for the 671B models;
``engine.models.families.nextn``; facts and sources in docs/families.md).
"""
from __future__ import annotations

from mlx_lm.models import deepseek_v3

from engine.models.families.nextn import MLANextNFamily


class DeepseekV3(MLANextNFamily):
    module = deepseek_v3

    def layer(self, args, index: int):
        return deepseek_v3.DeepseekV3DecoderLayer(args, index)


def family(name: str) -> DeepseekV3:
    return DeepseekV3(name)
