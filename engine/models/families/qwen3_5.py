"""Qwen3.5 / Qwen3.6 (``qwen3_5``, ``qwen3_5_moe``): Gated DeltaNet + gated attention trunk
(mlx-lm's ``qwen3_5`` / ``qwen3_5_moe``), the MTP head of MTP_SPEC §2 (``engine.models.mtp``),
the verify forward that captures every GDN step (``engine.models.trunk``).
"""
from __future__ import annotations

import logging

from engine.errors import ModelLoadError
from engine.models import trunk as trunk_ops
from engine.models.build import (Built, apply_weights, is_raw_hf_layout, load_trunk, mtp_key,
                                 quantize_like, stack_per_expert)
from engine.models.checkpoint import has_mtp, is_vision
from engine.models.families.base import Family

log = logging.getLogger(__name__)


class Qwen35(Family):
    # mlx-lm's qwen3_5 sanitize expects per-expert tensors already stacked; qwen3_next's
    # stacks them itself (and only then shifts the zero-centred norms).
    stack_experts = True

    def __init__(self, name: str) -> None:
        self.name = name

    def has_mtp(self, cfg, names) -> bool:
        return has_mtp(names)

    def build(self, cfg, weights: dict) -> Built:
        return build_qwen(cfg, weights, self)

    def build_trunk(self, cfg):
        return build_trunk(cfg)

    def text_model(self, trunk):
        return trunk.language_model

    def make_cache(self, trunk) -> list:
        return trunk.make_cache()

    def forward_hidden(self, text_model, inputs, cache: list, *, capture: bool = False,
                       mark: int | None = None):
        return trunk_ops.forward_hidden(text_model, inputs, cache, capture=capture, mark=mark)

    def marks(self, tokens: int) -> bool:
        return trunk_ops.marks(tokens)

    def lm_head(self, text_model, h):
        return trunk_ops.lm_head(text_model, h)

    def head_args(self, cfg):
        """mlx-lm's args the MTP head's layer is built from."""
        from mlx_lm.models.qwen3_5 import TextModelArgs

        return TextModelArgs.from_dict(dict(cfg.text))

    def head_layer(self, cfg, mtp_raw: dict):
        """``args -> decoder layer`` for the MTP head (``mtp_raw``: its tensors)."""
        from engine.models.mtp import gated_attention_layer

        return gated_attention_layer


def family(name: str) -> Family:
    return Qwen35(name)


def build_qwen(cfg, weights: dict, fam: Qwen35 | None = None) -> Built:
    """Trunk and ``mtp.*`` head of a Qwen-style checkpoint; ``fam`` builds the trunk and the
    head's layer (Qwen3.5 by default; Qwen3-Next subclasses it)."""
    fam = fam or Qwen35(cfg.family)
    raw_layout = is_raw_hf_layout(weights)
    vision_raw = {k: v for k, v in weights.items() if is_vision(k)}
    weights = {mtp_key(k): v for k, v in weights.items() if not is_vision(k)}
    mtp_raw = {k: v for k, v in weights.items() if k.startswith("mtp.")}
    trunk_raw = {k: v for k, v in weights.items() if not k.startswith("mtp.")}
    if fam.stack_experts:
        trunk_raw = stack_per_expert(trunk_raw)
    trunk = fam.build_trunk(cfg)
    trunk_w = load_trunk(trunk, trunk_raw, cfg.quantization)
    vision, notes = build_vision(cfg, vision_raw)
    if not mtp_raw:
        note = ("No mtp.* tensors: plain decoding only. Converters such as mlx_lm.convert "
                "drop the MTP head; convert from the official Qwen repo to keep it.")
        return Built(trunk, None, trunk_w, raw_layout, 0, (note,) + notes, vision)
    mtp, n_mtp = _build_mtp(cfg, mtp_raw, raw_layout, fam)
    return Built(trunk, mtp, trunk_w, raw_layout, n_mtp, notes, vision)


def build_vision(cfg, vision_raw: dict):
    """The vision encoder (``engine.vision.encoder``) when the checkpoint has a vision config
    and every tensor of it; (None, note) when the tensors are absent or partial (a text-only
    conversion: the model reads text only); a ModelLoadError when they are there but do not
    match the config."""
    vcfg = cfg.raw.get("vision_config") if isinstance(cfg.raw, dict) else None
    if not isinstance(vcfg, dict) or not vision_raw:
        return None, ()
    from mlx.utils import tree_flatten

    from engine.vision.encoder import VisionEncoder

    try:
        enc = VisionEncoder(vcfg)
    except (ValueError, TypeError, KeyError) as exc:
        return None, (f"The vision encoder is not supported ({exc}): text only.",)
    vq = cfg.raw.get("vision_quantization")
    if isinstance(vq, dict):  # `engine convert --vision-bits`: the layers it packed
        from engine.vision.encoder import quantize

        quantize(enc, bits=int(vq["bits"]), group_size=int(vq["group_size"]))
    w = enc.sanitize(vision_raw)
    names = {k for k, _ in tree_flatten(enc.parameters())}
    if not names <= set(w):  # e.g. a stub kept by a text-only conversion: text only, as before
        log.info("vision tensors incomplete (%d of %d): images off", len(names & set(w)),
                 len(names))
        return None, ()
    apply_weights(enc, {k: w[k] for k in names}, "vision encoder")
    return enc, ()


def build_trunk(cfg):
    """The mlx_lm trunk model for ``cfg`` (dense or MoE family), weights not yet loaded."""
    from mlx_lm.models import qwen3_5, qwen3_5_moe

    module = qwen3_5_moe if cfg.family == "qwen3_5_moe" else qwen3_5
    text = dict(cfg.text)
    text.setdefault("model_type", cfg.family)
    args = module.ModelArgs.from_dict({"model_type": cfg.family, "text_config": text})
    return module.Model(args)


def _build_mtp(cfg, mtp_raw: dict, raw_layout: bool, fam: Qwen35):
    from engine.models.mtp import MTPHead, sanitize_mtp

    args = fam.head_args(cfg)
    n_mtp = cfg.mtp_layers
    if n_mtp < 1:
        layer_ids = [k.split(".")[2] for k in mtp_raw if k.startswith("mtp.layers.")]
        if not layer_ids or not all(i.isdigit() for i in layer_ids):
            raise ModelLoadError("The mtp.* tensors have no numbered layers (mtp.layers.N).")
        n_mtp = 1 + max(int(i) for i in layer_ids)
    mtp = MTPHead(args, num_layers=n_mtp, layer=fam.head_layer(cfg, mtp_raw))
    # MTPLX packs keep Qwen's zero-centred MTP norms beside an MLX trunk: the pack says so.
    shift = raw_layout if cfg.mtp_norms is None else cfg.mtp_norms == "zero-centred"
    mtp_w = sanitize_mtp(mtp_raw, shift_norms=shift)
    quant = _mtp_quant(cfg)
    if quant:
        quantize_like(mtp, {f"mtp.{k}": v for k, v in mtp_w.items()}, quant, "mtp.")
    apply_weights(mtp, mtp_w, "MTP head")
    return mtp, n_mtp


def _mtp_quant(cfg) -> dict | None:
    """The MTP head's packing: its own record (MTPLX), else the model's, with per-layer
    overrides named under any MTP alias (``language_model.mtp.fc`` -> ``mtp.fc``)."""
    base = cfg.mtp_quantization or cfg.quantization
    if not base:
        return None
    per = {mtp_key(k): v for k, v in (cfg.quantization or {}).items() if isinstance(v, dict)}
    return {**per, "bits": base["bits"], "group_size": base.get("group_size", 64)}
