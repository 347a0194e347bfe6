"""Where a headless conversion's MTP head comes from, and what it costs to fetch.

A conversion made by ``mlx_lm.convert`` (mlx-community, LM Studio's downloads) keeps the trunk
and drops ``mtp.*``. The head is still in the repo the conversion was made from. This module
finds that repo and reads, from the Hub, only what a graft needs to plan:

- the candidates (:func:`candidates`): the user's ``--from``; the model card's ``base_model``
  (the folder's ``README.md`` front matter, else the conversion repo's card on the Hub); the
  conversion's own metadata (``mtpchat_graft``, ``base_model`` in config.json); the official
  Qwen repo its name or its config's shape matches (``OFFICIAL_SHAPES``);
- the source's plan (:func:`read_source`): commit, config.json, and the safetensors header of
  each shard that holds ``mtp.*`` or the trunk tensors the match check compares (HTTP Range
  requests: the 8-byte length, then the JSON header) — so the head's exact size and byte spans
  are known before a byte of weights is fetched;
- an offer for the verdicts (:func:`head_offer`): "MTP head available from REPO: 0.3 GB",
  cached on disk per (repo, commit) so ``list`` can show it offline.

Nothing here downloads weights, writes into a model folder, or runs code from a repo.
"""
from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import HubError, ModelLoadError
from engine.models import checkpoint

log = logging.getLogger(__name__)

MAX_CARD = 1 << 20
OFFER_TTL_S = 7 * 24 * 3600
# (family, hidden, layers) -> official repos with that text shape (MTP_SPEC §1).
OFFICIAL_SHAPES = {
    ("qwen3_5", 1024, 24): ("Qwen/Qwen3.5-0.8B",), ("qwen3_5", 2048, 24): ("Qwen/Qwen3.5-2B",),
    ("qwen3_5", 2560, 32): ("Qwen/Qwen3.5-4B",), ("qwen3_5", 4096, 32): ("Qwen/Qwen3.5-9B",),
    ("qwen3_5", 5120, 64): ("Qwen/Qwen3.5-27B", "Qwen/Qwen3.6-27B"),
    ("qwen3_next", 2048, 48): ("Qwen/Qwen3-Next-80B-A3B-Instruct",
                               "Qwen/Qwen3-Next-80B-A3B-Thinking"),
    ("glm4_moe", 4096, 46): ("zai-org/GLM-4.5-Air",),
    ("glm4_moe", 5120, 92): ("zai-org/GLM-4.5", "zai-org/GLM-4.6", "zai-org/GLM-4.7"),
    ("glm4_moe_lite", 2048, 47): ("zai-org/GLM-4.7-Flash",),
    ("deepseek_v3", 7168, 61): ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324",
                                "deepseek-ai/DeepSeek-V3.1"),
}
# Text-config fields a conversion copies verbatim from its source: all must agree.
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size",
                "linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval",
                "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "tie_word_embeddings",
                "n_routed_experts", "n_shared_experts", "q_lora_rank", "kv_lora_rank",
                "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


class GraftError(HubError):
    """A graft was refused (no source, a trunk that is not the source's, a head that does not
    fit); the model was left as it was."""


@dataclass(frozen=True)
class Shard:
    """One source shard: its size and sha256 (from the listing) and its header."""

    path: str
    size: int
    sha256: str | None
    header_len: int                   # 8 + n: where tensor data starts
    header: bytes                     # the raw 8 + n bytes read
    tensors: dict                     # name -> TensorMeta (offsets relative to header_len)


@dataclass(frozen=True)
class Source:
    """What a graft knows about its source repo before fetching any weights."""

    repo_id: str
    revision: str
    commit: str
    config: dict
    shards: dict[str, Shard]
    tensor_file: dict[str, str]       # tensor name -> shard path, for the shards read
    metadata_bytes: int               # config.json + index + headers read
    repo_bytes: int                   # every weight file: what a full download costs
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def head_names(self) -> list[str]:
        is_head = head_test(self.config)
        return sorted(n for n in self.tensor_file if is_head(n))

    @property
    def head_bytes(self) -> int:
        return sum(_nbytes(self.meta(n)) for n in self.head_names)

    def meta(self, name: str) -> dict:
        return self.shards[self.tensor_file[name]].tensors[name]

    @property
    def text(self) -> dict:
        t = self.config.get("text_config")
        return t if isinstance(t, dict) else self.config


def head_test(config: dict):
    """``name -> bool``: is a tensor of a checkpoint with this ``config.json`` part of its MTP
    head? ``mtp.*``; for the nextn families (``families.NEXTN``) the layer after the last,
    ``model.layers.{num_hidden_layers}.*``, without its copies of the embedding and LM head
    (the loader uses the trunk's: fetching them would cost 2 x vocab x hidden)."""
    from engine.models.families import NEXTN, NEXTN_COPIES

    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    n = text.get("num_hidden_layers")
    family = checkpoint.TYPE_FAMILY.get(str(config.get("model_type")))
    nextn = f"model.layers.{n}." if family in NEXTN and isinstance(n, int) else None

    def is_head(name: str) -> bool:
        if name.startswith(checkpoint.MTP_PREFIXES):
            return True
        return nextn is not None and name.startswith(nextn) and not name.endswith(NEXTN_COPIES)
    return is_head


def _nbytes(meta: dict) -> int:
    return int(meta["data_offsets"][1] - meta["data_offsets"][0])


# ----------------------------------------------------------------------------- candidates

def card_base_models(text: str) -> list[str]:
    """``base_model`` of a model card's YAML front matter (a name or a list of names)."""
    if not text.startswith("---"):
        return []
    end = text.find("\n---", 3)
    if end < 0:
        return []
    import yaml

    try:
        data = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return []
    base = data.get("base_model") if isinstance(data, dict) else None
    names = base if isinstance(base, list) else [base]
    return [n.strip() for n in names if isinstance(n, str) and _looks_like_repo(n.strip())]


def _looks_like_repo(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", name)) and ".." not in name


def _local_card(folder: Path) -> str:
    path = folder / "README.md"
    try:
        return checkpoint.read_regular(path, limit=MAX_CARD, what="README.md").decode(
            "utf-8", errors="replace") if path.is_file() else ""
    except ModelLoadError:
        return ""


def _remote_card(repo_id: str, token: str | None) -> str:
    from engine.hub import client as hub

    try:
        data = hub.fetch_bytes(repo_id, "README.md", revision="main", token=token,
                               byte_range=(0, MAX_CARD - 1))
    except HubError as exc:
        log.info("no model card for %s: %s", repo_id, exc)
        return ""
    return data.decode("utf-8", errors="replace")


def official_guesses(name: str | None, text: dict, family: str | None) -> list[str]:
    """The official Qwen repos a name ("mlx-community/Qwen3.5-9B-4bit") or a shape matches."""
    out = []
    m = re.search(r"(Qwen3\.[56]-[0-9.]+B(?:-A[0-9.]+B)?)", name or "", re.IGNORECASE)
    if m:
        out.append(f"Qwen/{m.group(1)}")
    key = (family, text.get("hidden_size"), text.get("num_hidden_layers"))
    for repo in OFFICIAL_SHAPES.get(key, ()):
        if repo.casefold() not in (o.casefold() for o in out):
            out.append(repo)
    return out


def candidates(folder: Path, *, explicit: str | None = None, repo_id: str | None = None,
               token: str | None = None, remote_card: bool = True) -> list[tuple[str, str]]:
    """(repo, why) in the order to try; ``repo_id`` is the conversion's own repo if known."""
    if explicit:
        return [(explicit, "--from")]
    raw = checkpoint.read_json(folder / "config.json", "config.json")
    return candidates_from(raw, _local_card(folder), repo_id=repo_id, name=folder.name,
                           token=token, remote_card=remote_card)


def candidates_from(raw: dict, card: str, *, repo_id: str | None, name: str | None = None,
                    token: str | None = None, remote_card: bool = True
                    ) -> list[tuple[str, str]]:
    """The candidates from a conversion's config.json, its model card and its names."""
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    found: list[tuple[str, str]] = []
    own = raw.get("mtpchat_graft") if isinstance(raw.get("mtpchat_graft"), dict) else {}
    for base in [own.get("source")] + [raw.get("base_model")]:
        if isinstance(base, str) and _looks_like_repo(base):
            found.append((base, "the conversion's metadata"))
    for base in card_base_models(card):
        found.append((base, "the model card's base_model"))
    if not found and repo_id and remote_card:
        for base in card_base_models(_remote_card(repo_id, token)):
            found.append((base, f"{repo_id}'s model card"))
    family = checkpoint.TYPE_FAMILY.get(str(raw.get("model_type")))
    for guess in official_guesses(repo_id or name, text, family):
        found.append((guess, "the official Qwen repo matching its config"))
    seen, out = set(), []
    for base, why in found:
        if base.casefold() not in seen and (not repo_id or base.casefold() != repo_id.casefold()):
            seen.add(base.casefold())
            out.append((base, why))
    return out


# ----------------------------------------------------------------------------- the source

def _header(repo_id: str, f, commit: str, token: str | None) -> Shard:
    from engine.hub.remote import remote_header

    blob, tensors = remote_header(repo_id, f.path, commit, token, f.size)
    return Shard(f.path, f.size, f.sha256, len(blob), blob, tensors)


def _wanted_shards(index: dict, shards: list[str], want: tuple[str, ...],
                   is_head) -> list[str]:
    """The shards holding the head (``is_head``) or a tensor whose name ends with ``want``."""
    wm = index.get("weight_map") if isinstance(index.get("weight_map"), dict) else None
    if not wm:
        return shards
    keep = {f for n, f in wm.items() if isinstance(f, str) and (is_head(n) or n.endswith(want))}
    return [s for s in shards if s in keep]


def read_source(repo_id: str, *, revision: str = "main", token: str | None = None,
                want: tuple[str, ...] = ()) -> Source:
    """Plan a graft from ``repo_id``: its config and the headers of the shards that matter."""
    from engine.hub import client as hub
    from engine.hub.remote import remote_json

    token = hub.resolve_token(token)
    listing = hub.list_repo(repo_id, revision=revision, token=token)
    config, used = remote_json(repo_id, listing, "config.json", token)
    if not config:
        raise GraftError(f"{repo_id} has no config.json: it is not a model repo to graft from")
    index, n_index = remote_json(repo_id, listing, checkpoint.INDEX_FILE, token)
    shards = sorted(f.path for f in listing.files if f.path.endswith(".safetensors")
                    and "/" not in f.path)
    repo_bytes = sum(f.size for f in listing.files if f.path in shards)
    heads = [_header(repo_id, listing.file(p), listing.commit, token)
             for p in _wanted_shards(index, shards, want, head_test(config))]
    tensor_file = {n: s.path for s in heads for n in s.tensors}
    meta = used + n_index + sum(len(s.header) for s in heads)
    return Source(repo_id, revision, listing.commit, config, {s.path: s for s in heads},
                  tensor_file, meta, repo_bytes)


# ----------------------------------------------------------------------------- offers

def _offers_path() -> Path:
    from engine.paths import data_dir

    return data_dir() / "mtp_head_offers.json"


def cached_offer(repo_id: str) -> dict | None:
    """The last offer read for a source repo (any commit), if recent."""
    try:
        data = json.loads(_offers_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = data.get(repo_id.casefold()) if isinstance(data, dict) else None
    if not isinstance(entry, dict) or time.time() - float(entry.get("at", 0)) > OFFER_TTL_S:
        return None
    return entry


def remember_offer(source: Source) -> dict:
    from engine.hub.store import write_json_atomic

    entry = {"repo_id": source.repo_id, "commit": source.commit, "bytes": source.head_bytes,
             "repo_bytes": source.repo_bytes, "at": time.time()}
    try:
        data = json.loads(_offers_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    data = data if isinstance(data, dict) else {}
    data[source.repo_id.casefold()] = entry
    try:
        write_json_atomic(_offers_path(), data)
    except OSError as exc:
        log.warning("cannot cache the MTP head offer: %s", exc)
    return entry


def offer_line(offer: dict) -> str:
    n = int(offer["bytes"])
    size = f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
    return f"MTP head available from {offer['repo_id']}: {size}"


def head_offer(folder: Path, *, repo_id: str | None = None, token: str | None = None,
               online: bool = True) -> dict | None:
    """The offer for a headless model folder (see :func:`offer_from`)."""
    try:
        raw = checkpoint.read_json(folder / "config.json", "config.json")
    except ModelLoadError:
        return None
    return offer_from(raw, _local_card(folder), repo_id=repo_id, name=folder.name, token=token,
                      online=online)


def repo_offer(repo_id: str, config: dict, *, token: str | None = None) -> dict | None:
    """The offer for a headless Hub repo (its card read from the Hub)."""
    return offer_from(config, _remote_card(repo_id, token), repo_id=repo_id, token=token,
                      online=True)


def offer_from(raw: dict, card: str, *, repo_id: str | None, name: str | None = None,
               token: str | None = None, online: bool = True) -> dict | None:
    """{repo_id, bytes, commit, line} for a headless supported model, or None.

    Online, the first candidate with a head is read from the Hub (its headers: the head's
    exact size) and remembered; offline only a remembered offer has a size, else the first
    candidate is named without one."""
    cands = candidates_from(raw, card, repo_id=repo_id, name=name, token=token,
                            remote_card=online)
    for cand, _why in cands:
        offer = cached_offer(cand)
        if offer is None and online:
            try:
                src = read_source(cand, token=token)
            except (HubError, ModelLoadError) as exc:
                log.info("no MTP head from %s: %s", cand, exc)
                continue
            if not src.head_names:
                continue
            offer = remember_offer(src)
        if offer is not None and offer.get("bytes"):
            return {**offer, "line": offer_line(offer)}
    if cands and not online:
        return {"repo_id": cands[0][0], "bytes": None, "commit": None,
                "line": f"MTP head can be added from {cands[0][0]} (graft)"}
    return None
