"""The independent oracle for the nextn families: transformers' own trunk, and an MTP head
assembled here from transformers' modules (its decoder-layer class, its RMSNorm, a Linear),
wired as vLLM's ``deepseek_mtp.py`` / ``glm4_moe_mtp.py`` wire it (docs/families.md). Nothing
of the engine is imported: a swapped concat, a missing norm or a recursion on the wrong
hidden shows up as a mismatch (``test_oracle_detects_wiring_mistakes``).

transformers drops the nextn layer at load (``_keys_to_ignore_on_load_unexpected``), so the
trunk is fed the checkpoint's other tensors (strict) and the head the nextn layer's, both as
stored on disk: per-expert tensors fused into transformers' [E, 2I, H] / [E, H, I].
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

torch.set_num_threads(1)  # tiny shapes: threads only contend with the other test processes

TORCH_CLASSES = {
    "glm4_moe": ("transformers.models.glm4_moe.configuration_glm4_moe.Glm4MoeConfig",
                 "transformers.models.glm4_moe.modeling_glm4_moe.Glm4MoeForCausalLM"),
    "glm4_moe_lite": (
        "transformers.models.glm4_moe_lite.configuration_glm4_moe_lite.Glm4MoeLiteConfig",
        "transformers.models.glm4_moe_lite.modeling_glm4_moe_lite.Glm4MoeLiteForCausalLM"),
    "deepseek_v3": ("transformers.models.deepseek_v3.configuration_deepseek_v3.DeepseekV3Config",
                    "transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3ForCausalLM"),
    "qwen3_next": ("transformers.models.qwen3_next.configuration_qwen3_next.Qwen3NextConfig",
                   "transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextForCausalLM"),
}


def _cls(path: str):
    import importlib

    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def fuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``...mlp.experts.N.{gate,up,down}_proj.weight`` -> transformers' fused experts."""
    groups: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    out = {}
    for k, v in state.items():
        parts = k.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            groups.setdefault(".".join(parts[:i + 1]), {}).setdefault(parts[i + 2], {})[
                int(parts[i + 1])] = v
        else:
            out[k] = v
    for prefix, per in groups.items():
        n = len(per["gate_proj"])
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([per["gate_proj"][e], per["up_proj"][e]]) for e in range(n)])
        out[f"{prefix}.down_proj"] = torch.stack([per["down_proj"][e] for e in range(n)])
    return out


def torch_trunk(folder: Path, tensors: dict[str, torch.Tensor]):
    cfg = json.loads((folder / "config.json").read_text())
    config_cls, model_cls = (_cls(p) for p in TORCH_CLASSES[cfg["model_type"]])
    config = config_cls(**{k: v for k, v in cfg.items()
                           if k not in ("model_type", "architectures", "dtype")})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    model = model_cls(config)
    n = cfg["num_hidden_layers"]
    state = {k: v for k, v in tensors.items()
             if not k.startswith(tuple(f"model.layers.{n + j}." for j in range(4)) + ("mtp.",))}
    model.load_state_dict(fuse_experts(state), strict=True)
    return model.float().eval()


class TorchNextN(torch.nn.Module):
    """One nextn MTP layer from transformers' modules and the checkpoint's nextn tensors,
    including its own copies of the embedding and LM head (``embed_tokens``,
    ``shared_head.head``): the engine shares the trunk's, so equal outputs also check that
    the copies are what the trunk holds."""

    def __init__(self, trunk, tensors: dict[str, torch.Tensor], *, wiring: str = "vllm"):
        super().__init__()
        config = trunk.config
        h, n = config.hidden_size, config.num_hidden_layers
        object.__setattr__(self, "trunk", trunk)
        norm = type(trunk.model.norm)
        self.enorm, self.hnorm = norm(h, eps=config.rms_norm_eps), norm(h, eps=config.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * h, h, bias=False)
        self.layer = type(trunk.model.layers[-1])(_with_nextn_layer(config), n)
        self.shared_head_norm = norm(h, eps=config.rms_norm_eps)
        self.head = torch.nn.Linear(h, config.vocab_size, bias=False)
        self.embed = torch.nn.Embedding(config.vocab_size, h)
        self.wiring = wiring  # "vllm", or a deliberate mistake (the oracle's own test)
        prefix = f"model.layers.{n}."
        state = {}
        for k, v in tensors.items():
            if not k.startswith(prefix):
                continue
            name = k[len(prefix):]
            name = {"shared_head.norm.weight": "shared_head_norm.weight",
                    "shared_head.head.weight": "head.weight",
                    "embed_tokens.weight": "embed.weight"}.get(name, name)
            if not name.startswith(("enorm", "hnorm", "eh_proj", "shared_head_norm", "head",
                                    "embed")):
                name = "layer." + name
            state[name] = v
        self.load_state_dict(fuse_experts(state), strict=True)
        self.float().eval()

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [1, S, H], ids [1, S]: pair s at position s (causal over the S pairs) ->
        (the layer's output [1, S, H] before shared_head.norm, logits [1, S, V])."""
        e, hh = self.enorm(self.embed(ids)), self.hnorm(hidden)
        z = self.eh_proj(torch.cat([hh, e] if self.wiring == "swapped" else [e, hh], -1))
        s = z.shape[1]
        positions = torch.arange(s)[None]
        rope = self.trunk.model.rotary_emb(z, positions)
        mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
        out = self.layer(z, position_embeddings=rope, attention_mask=mask,
                         position_ids=positions)
        if isinstance(out, tuple):
            out = out[0]
        return out, self.head(self.shared_head_norm(out))

    def recursed(self, out: torch.Tensor) -> torch.Tensor:
        """What step j+1 reads: the output before shared_head.norm (vLLM); after it with
        ``wiring="recursion"`` (the deliberate mistake)."""
        return self.shared_head_norm(out) if self.wiring == "recursion" else out


class TorchQwenMTP(torch.nn.Module):
    """Qwen3-Next's ``mtp.*`` head from transformers' modules (its ``Qwen3NextRMSNorm``,
    ``Qwen3NextDecoderLayer`` as a full-attention MoE layer, a Linear), wired as vLLM's
    ``qwen3_next_mtp.py``: ``fc(concat([pre_fc_norm_embedding(embed(x)),
    pre_fc_norm_hidden(h)]))``, the layer, ``mtp.norm``; the trunk's embedding and LM head
    (vLLM shares them); step j+1 reads step j's output after ``mtp.norm``."""

    def __init__(self, trunk, tensors: dict[str, torch.Tensor], *, wiring: str = "vllm"):
        import copy

        super().__init__()
        config = copy.deepcopy(trunk.config)
        h, n = config.hidden_size, config.num_hidden_layers
        config.layer_types = list(config.layer_types) + ["full_attention"]
        object.__setattr__(self, "trunk", trunk)
        norm = type(trunk.model.norm)
        self.pre_fc_norm_embedding = norm(h, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = norm(h, eps=config.rms_norm_eps)
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.layer = type(trunk.model.layers[-1])(config, n)  # full attention, MoE
        self.norm = norm(h, eps=config.rms_norm_eps)
        self.wiring = wiring
        state = {}
        for k, v in tensors.items():
            if k.startswith("mtp.layers.0."):
                state["layer." + k[len("mtp.layers.0."):]] = v
            elif k.startswith("mtp."):
                state[k[len("mtp."):]] = v
        self.load_state_dict(fuse_experts(state), strict=True)
        self.float().eval()

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [1, S, H], ids [1, S]: pair s at position s -> (the head's output after
        mtp.norm [1, S, H], logits [1, S, V])."""
        e = self.pre_fc_norm_embedding(self.trunk.model.embed_tokens(ids))
        hh = self.pre_fc_norm_hidden(hidden)
        z = self.fc(torch.cat([hh, e] if self.wiring == "swapped" else [e, hh], -1))
        s = z.shape[1]
        positions = torch.arange(s)[None]
        rope = self.trunk.model.rotary_emb(z, positions)
        mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
        pre = self.layer(z, position_embeddings=rope, attention_mask=mask,
                         position_ids=positions)
        if isinstance(pre, tuple):
            pre = pre[0]
        out = self.norm(pre)
        self.last_pre_norm = pre
        return out, self.trunk.lm_head(out)

    def recursed(self, out: torch.Tensor) -> torch.Tensor:
        """What step j+1 reads: the output after mtp.norm (vLLM); before it with
        ``wiring="recursion"`` (the deliberate mistake)."""
        return self.last_pre_norm[:, -1:] if self.wiring == "recursion" else out


def _with_nextn_layer(config):
    """``config`` with a per-layer kind for layer n (the nextn layer is sparse, MoE), for
    modeling files that index ``mlp_layer_types`` by layer (GLM-4.7-Flash)."""
    import copy

    kinds = getattr(config, "mlp_layer_types", None)
    if not kinds:
        return config
    config = copy.deepcopy(config)
    config.mlp_layer_types = list(kinds) + ["sparse"]
    return config


def reference_drafts(folder: Path, prompt: list[int], k: int, *, wiring: str = "vllm"):
    """Greedy: the trunk's next token x0 after ``prompt``, then k drafts of the reference
    head by recursion (step j+1 on what vLLM recurses on — or the other side of the final
    norm, with ``wiring="recursion"``). Returns (x0, drafts, logits per step [k, V])."""
    tensors = read_tensors(folder)
    trunk = torch_trunk(folder, tensors)
    head = (TorchQwenMTP if trunk.config.model_type == "qwen3_next" else TorchNextN)(
        trunk, tensors, wiring=wiring)
    with torch.no_grad():
        x = torch.tensor([prompt])
        hidden = trunk.model(input_ids=x).last_hidden_state
        x0 = int(trunk.lm_head(hidden[0, -1]).argmax())
        hs, ids = hidden, torch.tensor([prompt[1:] + [x0]])
        drafts, logits = [], []
        for _ in range(k):
            out, lg = head(hs, ids)
            logits.append(lg[0, -1])
            d = int(lg[0, -1].argmax())
            drafts.append(d)
            nxt = head.recursed(out[:, -1:])
            hs = torch.cat([hs, nxt], 1)
            ids = torch.cat([ids, torch.tensor([[d]])], 1)
    return x0, drafts, torch.stack(logits).double().numpy()


def torch_greedy(folder: Path, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (n tokens, full recompute each step)."""
    trunk = torch_trunk(folder, read_tensors(folder))
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = trunk(input_ids=torch.tensor([ids])).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]
