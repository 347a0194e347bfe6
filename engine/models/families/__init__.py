"""The family seam: what differs between checkpoint families, behind one interface
(:class:`engine.models.families.base.Family`), one module per family, keyed by ``model_type``.

The tables here are plain data (read by ``engine.models.checkpoint`` and the hub's search
before anything heavy is imported); :func:`get` imports a family's module on first use.
"""
from __future__ import annotations

import importlib

# ModelInfo.family -> the module that implements it (engine/models/families/<module>.py).
MODULES = {"qwen3_5": "qwen3_5", "qwen3_5_moe": "qwen3_5", "glm4_moe": "glm4_moe",
           "glm4_moe_lite": "glm4_moe_lite", "deepseek_v3": "deepseek_v3",
           "qwen3_next": "qwen3_next"}
# config.json model_type (top level or text_config) -> family.
TYPE_FAMILY = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
               "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
               "glm4_moe": "glm4_moe", "glm4_moe_lite": "glm4_moe_lite",
               "deepseek_v3": "deepseek_v3", "qwen3_next": "qwen3_next"}
# config.json architectures[0] -> family.
ARCH_FAMILY = {
    "Qwen3_5ForConditionalGeneration": "qwen3_5", "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe", "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "Glm4MoeForCausalLM": "glm4_moe", "Glm4MoeLiteForCausalLM": "glm4_moe_lite",
    "DeepseekV3ForCausalLM": "deepseek_v3", "Qwen3NextForCausalLM": "qwen3_next",
}
# Families whose MTP head is DeepSeek's "nextn" layer, stored as the layer after the last
# (``model.layers.{num_hidden_layers}.*``, with copies of the embedding and LM head the
# engine does not use); the others store it as ``mtp.*``.
NEXTN = frozenset({"glm4_moe", "glm4_moe_lite", "deepseek_v3"})
NEXTN_COPIES = ("embed_tokens.weight", "shared_head.head.weight")
# Families whose checkpoints store RMSNorm weights zero-centred (scale = 1 + w; mlx-lm adds
# the 1 when converting).
ZERO_CENTRED = frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_next"})
NAMES = ("Qwen3.5 / Qwen3.6 (dense and MoE), GLM-4.5/4.6/4.7 (glm4_moe), GLM-4.7-Flash "
         "(glm4_moe_lite), DeepSeek-V3 and Qwen3-Next")


def get(family: str):
    """The :class:`~engine.models.families.base.Family` for ``family`` (a ModelInfo.family)."""
    try:
        module = MODULES[family]
    except KeyError:
        raise KeyError(f"no model family {family!r}") from None
    return importlib.import_module(f"engine.models.families.{module}").family(family)
