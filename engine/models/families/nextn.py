"""DeepSeek-style "nextn" MTP layers (GLM-4.x MoE, DeepSeek-V3): the head and its checkpoint.

The raw checkpoint stores the MTP layer as the layer after the last,
``model.layers.{num_hidden_layers}.*`` (``num_nextn_predict_layers`` of them): a full decoder
layer of the trunk's kind (attention + MoE) plus ``enorm``, ``hnorm``, ``eh_proj`` (Linear
2H -> H, no bias), ``shared_head.norm``, and byte copies of the embedding
(``embed_tokens``) and of the LM head (``shared_head.head``). For a pair (trunk hidden h_t after
the final norm, next token x_{t+1}) rotated at position t (docs/families.md has the sources):

    z = eh_proj(concat([enorm(embed(x_{t+1})), hnorm(h_t)]))   # embedding first, hidden second
    z = decoder_layer(z)                                        # own KV cache, one row per pair
    logits = lm_head(shared_head.norm(z))                       # predicts x_{t+2}

and depth > 1 recurses on ``z`` **before** ``shared_head.norm`` (vLLM's ``deepseek_mtp``:
``forward`` returns the pre-norm hidden, ``compute_logits`` norms it) — unlike Qwen3.5, whose
head recurses on its output after ``mtp.norm``. Every norm here is a plain RMSNorm (weight
as stored, no +1). The embedding and LM head copies are not loaded: the head shares the
trunk's (vLLM's proposer shares them too); their shapes are checked.

This engine's MLX layout (``engine convert``) writes the head as ``mtp.*`` under this
module's parameter names (experts stacked), so a converted checkpoint keeps its head.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from engine.errors import ModelLoadError
from engine.models.build import Built, apply_weights, load_trunk, quantize_like, short_error
from engine.models.checkpoint import nextn_names
from engine.models.families.base import Family

HEAD_PARTS = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")
COPIES = ("embed_tokens.weight", "shared_head.head.weight")  # checked, not loaded
NEEDED = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")


class SharedHead(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)


class NextNHead(nn.Module):
    """One nextn MTP layer around ``layer`` (an mlx-lm decoder layer of the trunk's kind)."""

    def __init__(self, args, layer, *, kv_shapes, mask_array: bool = False) -> None:
        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.enorm = nn.RMSNorm(h, eps=eps)
        self.hnorm = nn.RMSNorm(h, eps=eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layers = [layer]
        self.shared_head = SharedHead(h, eps)
        self._kv_shapes = kv_shapes
        self._mask_array = mask_array

    def __call__(self, hidden: mx.array, token_embeds: mx.array, cache: list,
                 at: mx.array | None = None) -> mx.array:
        """hidden, token_embeds: [B, S, H] -> the layer's output [B, S, H] before
        ``shared_head.norm`` (what depth > 1 recurses on); with ``at`` [B] only position
        ``at[b]`` of each row [B, 1, H] (the layer runs as mlx-lm's, every position)."""
        z = self.eh_proj(mx.concatenate([self.enorm(token_embeds), self.hnorm(hidden)], -1))
        mask = create_attention_mask(z, cache[0], return_array=self._mask_array)
        out = self.layers[0](z, mask, cache[0])
        return out if at is None else mx.take_along_axis(out, at[:, None, None], axis=1)

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def kv_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return self._kv_shapes


class NextNFamily(Family):
    """A trunk from mlx-lm's ``module`` (attention-only: rollback is the KV trim every
    trimmable cache gets) and a :class:`NextNHead`. Subclasses name the module and the head's
    cache shapes."""

    module = None  # mlx_lm.models.<family>
    mask_array = False

    def __init__(self, name: str) -> None:
        self.name = name

    def kv_shapes(self, args) -> tuple[tuple[int, int], tuple[int, int]]:
        raise NotImplementedError

    # -- the checkpoint -----------------------------------------------------------------
    def has_mtp(self, cfg, names) -> bool:
        return bool(nextn_names(cfg, names)) or any(n.startswith("mtp.") for n in names)

    def build_trunk(self, cfg):
        text = dict(cfg.text)
        text.setdefault("model_type", cfg.family)
        return self.module.Model(self.module.ModelArgs.from_dict(text))

    def build(self, cfg, weights: dict) -> Built:
        nextn = set(nextn_names(cfg, weights))
        mtp_raw = {k: v for k, v in weights.items() if k in nextn or k.startswith("mtp.")}
        trunk = self.build_trunk(cfg)
        raw_layout = bool(nextn) or any(".mlp.experts.0." in k for k in weights)
        check_expert_shapes(weights)
        trunk_w = load_trunk(trunk, {k: v for k, v in weights.items() if k not in mtp_raw},
                             cfg.quantization)
        declared = int(cfg.text.get("num_nextn_predict_layers") or 0)
        if not mtp_raw:
            note = (f"No nextn MTP layer (model.layers.{cfg.text['num_hidden_layers']}.*): plain "
                    "decoding only. mlx_lm.convert drops it; convert from the original repo "
                    "with `engine convert` to keep it.")
            return Built(trunk, None, trunk_w, raw_layout, 0, (note,))
        head_w = self._head_weights(cfg, trunk, mtp_raw, declared)
        head = NextNHead(trunk.args, self.layer(trunk.args, int(cfg.text["num_hidden_layers"])),
                         kv_shapes=self.kv_shapes(trunk.args), mask_array=self.mask_array)
        quant = cfg.mtp_quantization or cfg.quantization  # a graft's own packing, else the model's
        if quant:
            quantize_like(head, {f"mtp.{k}": v for k, v in head_w.items()}, quant, "mtp.")
        apply_weights(head, head_w, "MTP head")
        notes = (f"config.json declares {declared} nextn layers; the first drafts every "
                 "step.",) if declared > 1 else ()
        return Built(trunk, head, trunk_w, raw_layout, 1, notes)

    def layer(self, args, index: int):
        """The trunk's decoder layer class, built as layer ``index`` (MoE where the trunk's
        layers that deep are)."""
        raise NotImplementedError

    def _head_weights(self, cfg, trunk, mtp_raw: dict, declared: int) -> dict:
        n = int(cfg.text["num_hidden_layers"])
        if any(k.startswith("mtp.") for k in mtp_raw):  # this engine's MLX layout
            head_w = {k[len("mtp."):]: v for k, v in mtp_raw.items() if k.startswith("mtp.")}
        else:
            head_w = self._from_raw(cfg, trunk, mtp_raw, n)
        if declared < 1:
            raise ModelLoadError(
                f"The checkpoint holds a nextn MTP layer (model.layers.{n}.*) but config.json "
                f"says num_nextn_predict_layers is {declared}; fix the config (1) or "
                "re-download the model.")
        missing = [k for k in NEEDED if k not in head_w]
        if missing:
            raise ModelLoadError(
                f"The nextn MTP layer model.layers.{n} lacks {', '.join(missing)}: the "
                "checkpoint is incomplete. Re-download the model.")
        return head_w

    def _from_raw(self, cfg, trunk, mtp_raw: dict, n: int) -> dict:
        """``model.layers.{n}.*`` -> head parameter names; the decoder layer's tensors go
        through the trunk's own sanitize (stacked experts, MLA's split ``kv_b_proj``)."""
        declared = int(cfg.text.get("num_nextn_predict_layers") or 0)
        later = sorted({int(k.split(".")[2]) for k in mtp_raw})
        if declared > 1 and later != list(range(n, n + declared)):
            raise ModelLoadError(
                f"config.json says num_nextn_predict_layers is {declared} but the checkpoint "
                f"holds nextn layers {later}; fix the config or re-download the model.")
        prefix = f"model.layers.{n}."
        head, layer = {}, {}
        vocab, hidden = int(cfg.text["vocab_size"]), int(cfg.text["hidden_size"])
        for k, v in mtp_raw.items():
            if not k.startswith(prefix):
                continue
            name = k[len(prefix):]
            if name in COPIES:
                if tuple(v.shape) != (vocab, hidden):
                    raise ModelLoadError(
                        f"{k} has shape {list(v.shape)}, not [{vocab}, {hidden}] "
                        "(vocab_size, hidden_size): the checkpoint does not match config.json.")
            elif name.startswith(HEAD_PARTS):
                head[name] = v
            else:
                layer[f"model.layers.0.{name}"] = v
        try:
            layer = trunk.sanitize(layer)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"Unexpected nextn layer layout: {short_error(exc)}") from exc
        head.update({"layers.0." + k[len("model.layers.0."):]: v for k, v in layer.items()})
        return head

    # -- the trunk and the head -------------------------------------------------------------
    def forward_hidden(self, text_model, inputs, cache: list, *, capture: bool = False,
                       mark: int | None = None):
        """mlx-lm's own forward (attention only: nothing to capture; a rejected draft is a
        KV trim). ``marks`` is False: never asked for a ``mark``."""
        return text_model.model(inputs, cache), {}

    def lm_head(self, text_model, h):
        return text_model.lm_head(h)

    def draft_hidden(self, text_model, mtp, out):
        return mtp.shared_head.norm(out)



def check_expert_shapes(weights: dict) -> None:
    """Per-expert tensors of one layer are stacked, so each must have its expert 0's shape:
    the first that does not is named (a stacking error would not say which)."""
    first: dict[str, tuple] = {}
    for k, v in weights.items():
        parts = k.split(".")
        if "experts" not in parts or not parts[parts.index("experts") + 1].isdigit():
            continue
        i = parts.index("experts")
        slot = ".".join(parts[:i + 1] + parts[i + 2:])
        shape = tuple(v.shape)
        if first.setdefault(slot, shape) != shape:
            raise ModelLoadError(
                f"{k} has shape {list(shape)}, unlike the layer's other experts "
                f"({list(first[slot])}): the checkpoint is corrupt. Re-download the model.")


class MLANextNFamily(NextNFamily):
    """A trunk with multi-head latent attention (DeepSeek-V3's design): its cache holds the
    compressed KV latent and the rotary key part, and it applies the mask to its rotary scores
    itself (``mx.where``), so the head's mask is an array."""

    mask_array = True

    def kv_shapes(self, args):
        return (1, args.kv_lora_rank), (1, args.qk_rope_head_dim)
