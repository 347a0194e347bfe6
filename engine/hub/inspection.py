"""Look at a model before loading or downloading it: is it supported, can it speculate, does it fit?

Only ``config.json``, the safetensors index and the safetensors *headers* are read (the 8-byte
little-endian header length, then the JSON header): never the weights. Remotely the headers are
fetched with HTTP Range requests, so checking a 50 GB repo costs a few hundred KB.

Both functions return the same plain dict (JSON-able); see :func:`analyse` for its keys. The
verdict comes from the loader's own checks (:mod:`engine.models.checkpoint` for the config and headers,
:func:`engine.models.build.check_build` for names and shapes, on lazy arrays), so "supported" means
``engine.load`` accepts the folder. (Renamed from ``engine.inspect``, which shadowed the
standard library's ``inspect``.)
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.models import checkpoint
from engine.hub.remote import remote_header, remote_json
from engine.models.checkpoint import Checkpoint, parse_config, parse_header, read_header

log = logging.getLogger(__name__)

MAX_REMOTE_SHARDS = 128
CONTEXT_FOR_ESTIMATE = 8192
RUNTIME_OVERHEAD = 512 * 2**20
CONVERT_HINT = "convert from the official Qwen repo: python -m engine pull {repo} --convert --bits 4"

__all__ = ["analyse", "inspect_local", "inspect_repo", "machine_verdict", "memory_needed",
           "needed_file", "parse_header", "read_header", "with_offer"]


def _int(d: dict, key: str, default: int = 0) -> int:
    v = d.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 else default


def _cache_estimate(text: dict) -> int:
    """KV cache for CONTEXT_FOR_ESTIMATE tokens + the Gated DeltaNet states (float32)."""
    layers = _int(text, "num_hidden_layers")
    hybrid = _int(text, "linear_num_value_heads") > 0  # Gated DeltaNet + attention
    interval = _int(text, "full_attention_interval", 4) if hybrid else 1
    full = layers // interval if interval else layers
    if _int(text, "kv_lora_rank"):  # MLA (DeepSeek-V3): the latent and the rotary key
        kv = full * (_int(text, "kv_lora_rank") + _int(text, "qk_rope_head_dim"))
    else:
        kv = 2 * full * _int(text, "num_key_value_heads") * _int(text, "head_dim")
    kv_bytes = kv * 2 * CONTEXT_FOR_ESTIMATE
    gdn = (layers - full) * _int(text, "linear_num_value_heads") * \
        _int(text, "linear_value_head_dim") * _int(text, "linear_key_head_dim") * 4
    return kv_bytes + 4 * gdn  # states kept for a few verify positions


def memory_needed(weight_bytes: int, text_config: dict) -> int:
    """Bytes of memory to run: the text weights, caches for 8k tokens, 10% + 512 MiB slack."""
    return int(weight_bytes * 1.10) + _cache_estimate(text_config) + RUNTIME_OVERHEAD


def _guess_family(config: dict) -> tuple[str | None, str | None]:
    """Architecture and family for the report, also for configs the loader refuses."""
    archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    archs = [a for a in archs if isinstance(a, str)]
    for a in archs:
        if a in checkpoint.ARCH_FAMILY:
            return a, checkpoint.ARCH_FAMILY[a]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for mt in (config.get("model_type"), text.get("model_type")):
        if isinstance(mt, str) and mt in checkpoint.TYPE_FAMILY:
            return (archs[0] if archs else None), checkpoint.TYPE_FAMILY[mt]
    return (archs[0] if archs else None), None


def blockers(config: dict, tensors: dict | None, *, names: list[str],
             problems: list[ModelLoadError] = ()) -> list[str]:
    """Why the loader would refuse this model (empty when it loads): the same checks."""
    out = [_reason(p) for p in problems]
    try:
        cfg = parse_config(config)
    except ModelLoadError as exc:
        return [_reason(exc), *out]
    if not names and not out:
        out.append("no safetensors weights found")
    if tensors and not out:
        from engine.models.build import check_build

        try:
            check_build(Checkpoint(config=cfg, tensors=tensors))
        except ModelLoadError as exc:
            out.append(_reason(exc))
    return out


def _reason(exc: ModelLoadError) -> str:
    kind = "not supported" if isinstance(exc, UnsupportedModelError) else "cannot be loaded"
    return f"{kind}: {exc}"


def analyse(config: dict, *, names: list[str], tensors: dict | None, total_bytes: int,
            source: str, repo_id: str | None = None, notes: list[str] | None = None,
            problems: list[ModelLoadError] = ()) -> dict:
    """Turn what was read into the inspection report.

    Keys: source, architecture, family, model_type, layout, parameters (None if unknown),
    parameters_estimated, bytes (all weight files), weight_bytes (text weights the engine loads),
    quantization, has_mtp, mtp_layers, memory_needed_bytes, supported, can_speculate,
    reasons (why not / warnings), fix (a command to run, or None), machine (memory verdict).
    ``supported`` is True exactly when ``engine.load`` would accept what was read.
    """
    arch, family = _guess_family(config)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    quant = config.get("quantization") if isinstance(config.get("quantization"), dict) else None
    has_mtp = checkpoint.has_mtp(names) or bool(checkpoint.nextn_in(text, names))
    if tensors:
        weight_bytes = checkpoint.weight_bytes(tensors)
        params, estimated = checkpoint.parameters(tensors, quant), False
    else:
        weight_bytes = total_bytes
        per = 4 if "32" in str(text.get("dtype") or config.get("torch_dtype") or "") else 2
        params, estimated = (total_bytes // per if total_bytes and not quant else None), True
    blocked = blockers(config, tensors, names=names, problems=list(problems))
    supported = not blocked
    reasons = list(notes or []) + blocked
    fix = None
    if supported and not has_mtp:
        reasons.append("no MTP head (mtp.* tensors or a nextn layer): the model will run but "
                       "cannot speculate (typical of mlx-community / mlx_lm.convert "
                       "conversions, which drop the MTP head)")
        fix = CONVERT_HINT.format(repo=_official_repo_guess(repo_id, config))
    mem = memory_needed(weight_bytes, text)
    return {
        "source": source, "repo_id": repo_id, "architecture": arch, "family": family,
        "model_type": config.get("model_type"), "layout": checkpoint.layout(tensors or {}),
        "parameters": params, "parameters_estimated": estimated, "bytes": total_bytes,
        "weight_bytes": weight_bytes, "quantization": quant, "has_mtp": has_mtp,
        "mtp_layers": (_int(text, "mtp_num_hidden_layers")
                       or _int(text, "num_nextn_predict_layers")) if has_mtp else 0,
        "memory_needed_bytes": mem, "supported": supported, "can_speculate": supported and has_mtp,
        "reasons": reasons, "fix": fix,
        "machine": machine_verdict(mem, active_bytes=active_bytes(tensors, text, weight_bytes)),
    }


def with_offer(report: dict, offer: dict | None, *, target: str, pulled: bool = True) -> dict:
    """``report`` for a headless model whose MTP head can be grafted from ``offer``'s repo
    (``engine.hub.graft_source.offer_from``): says so with the head's size, and the fix is
    ``graft`` instead of converting the whole official checkpoint."""
    if offer is None or not report["supported"] or report["has_mtp"]:
        return report
    reasons = [r for r in report["reasons"] if not r.startswith("no mtp.* tensors")]
    reasons.append(f"no mtp.* tensors (the conversion dropped its MTP head); {offer['line']}")
    cmd = f"python -m engine graft {target}"
    if not pulled:
        cmd = f"python -m engine pull {target} && {cmd}"
    return {**report, "reasons": reasons, "mtp_head": offer,
            "fix": f"add the MTP head, downloading only it: {cmd}"}


def _official_repo_guess(repo_id: str | None, config: dict) -> str:
    """Qwen/Qwen3.5-4B for mlx-community/Qwen3.5-4B-4bit; a placeholder when unsure."""
    import re

    m = re.search(r"(Qwen3\.[56]-[0-9.]+B(?:-A[0-9.]+B)?)", repo_id or "", re.IGNORECASE)
    return f"Qwen/{m.group(1)}" if m else "Qwen/Qwen3.5-<size>"


def machine_verdict(memory_bytes: int, *, total_memory: int | None = None,
                    active_bytes: int = 0, machine: dict | None = None) -> dict:
    """Does it fit this machine's memory, and would it decode fast enough here? (Thresholds in
    engine.hub.catalog; speed from the measured bandwidth unless memory alone was injected.)"""
    from engine.hub.catalog import figures_for, memory_verdict

    return memory_verdict(memory_bytes, total_memory=total_memory, active_bytes=active_bytes,
                          machine=figures_for(total_memory, machine))


def active_bytes(tensors: dict | None, text: dict, weight_bytes: int) -> int:
    """Bytes a decode step reads: every text weight, MoE experts scaled by top-k / experts."""
    experts = _int(text, "num_experts") or _int(text, "n_routed_experts")
    k = _int(text, "num_experts_per_tok")
    if not tensors or not experts or not k:
        return weight_bytes
    total = 0.0
    for name, meta in tensors.items():
        if checkpoint.is_vision(name):
            continue
        n = checkpoint.numel(meta["shape"]) * checkpoint.DTYPE_BYTES.get(meta["dtype"], 2)
        total += n * k / experts if (".experts." in name or ".switch_mlp." in name) else n
    return int(total)


# ----------------------------------------------------------------------------- local

def inspect_local(path: str | Path, *, offer: str | None = "cached",
                  repo_id: str | None = None) -> dict:
    """Inspect a model folder on disk (config.json + every shard header, bounded reads).

    Raises ModelLoadError only when there is nothing to report on (no folder, no readable
    config.json); every other problem makes the report say ``supported: false`` and why.
    ``offer``: for a headless model, look up where its MTP head can be grafted from —
    "online" (reads the source's headers), "cached" (what an earlier look-up found; no
    network), or None (don't).
    """
    report = _inspect_local(Path(path))
    if offer and report["supported"] and not report["has_mtp"]:
        from engine.hub.graft_source import head_offer

        found = head_offer(Path(path), repo_id=repo_id, online=offer == "online")
        report = with_offer(report, found, target=repo_id or str(path))
    return report


def _inspect_local(path: Path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"{path} is not a folder")
    config = checkpoint.read_json(path / "config.json", "config.json")
    tensors: dict = {}
    problems: list[ModelLoadError] = []
    try:
        cfg = checkpoint.with_runtime(path, parse_config(config))
    except ModelLoadError:
        cfg = None  # blockers() reports why
    try:
        shards = checkpoint.shard_files(path, cfg)
    except ModelLoadError as exc:
        problems.append(exc)
        shards = []
    total = 0
    for f in shards:
        try:
            tensors.update(read_header(f))
        except ModelLoadError as exc:
            problems.append(exc)
        total += f.stat().st_size if f.is_file() else 0
    names = list(tensors) or [p.name for p in shards]
    return analyse(config, names=names, tensors=tensors if not problems else None,
                   total_bytes=total, source=str(path), problems=problems)


# ----------------------------------------------------------------------------- remote

def _remote_tensors(repo_id: str, listing, shards: list[str], token: str | None):
    """(tensors, problems) from every shard header, fetched in parallel."""
    sizes = {f.path: f.size for f in listing.files}

    def one(fname: str):
        try:
            return remote_header(repo_id, fname, listing.commit, token, sizes[fname])[1], None
        except ModelLoadError as exc:
            return {}, exc

    with ThreadPoolExecutor(max_workers=min(8, len(shards))) as pool:
        results = list(pool.map(one, shards))
    tensors = {k: v for h, _ in results for k, v in h.items()}
    return tensors, [e for _, e in results if e is not None]


def inspect_repo(repo_id: str, *, revision: str = "main", token: str | None = None,
                 offer: bool = True) -> dict:
    """Inspect a Hub repo without downloading weights: file list, config.json, index, headers."""
    from engine.hub import client as hub

    listing = hub.list_repo(repo_id, revision=revision, token=token)
    shards = sorted(f.path for f in listing.files if f.path.endswith(".safetensors")
                    and "/" not in f.path)
    total = sum(f.size for f in listing.files if f.path in shards)
    if listing.file("config.json") is None:
        raise ModelLoadError(f"{repo_id} has no config.json: it is not a transformers model repo")
    config = remote_json(repo_id, listing, "config.json", token)[0]
    tensors: dict | None = None
    names: list[str] = []
    notes: list[str] = []
    problems: list[ModelLoadError] = []
    if listing.file(checkpoint.INDEX_FILE) is not None:
        wm = remote_json(repo_id, listing, checkpoint.INDEX_FILE, token)[0].get("weight_map")
        names = list(wm) if isinstance(wm, dict) else []
    if shards and len(shards) <= MAX_REMOTE_SHARDS:
        tensors, problems = _remote_tensors(repo_id, listing, shards, token)
        names = list(tensors) or names
        tensors = None if problems else tensors
    elif shards:
        notes.append(f"{len(shards)} weight files: sizes estimated from the file list")
    report = analyse(config, names=names, tensors=tensors, total_bytes=total,
                     source=f"{hub.endpoint()}/{repo_id}", repo_id=repo_id, notes=notes,
                     problems=problems)
    report.update(revision=revision, commit=listing.commit,
                  download_bytes=sum(f.size for f in listing.files if needed_file(f.path)))
    if offer and report["supported"] and not report["has_mtp"]:
        from engine.hub.graft_source import repo_offer

        report = with_offer(report, repo_offer(repo_id, config, token=token), target=repo_id,
                            pulled=False)
    return report


def needed_file(path: str) -> bool:
    """Files a model needs: weights, JSON configs, tokenizer files and the chat template."""
    if "/" in path:
        return False
    name = path.lower()
    return (name.endswith((".safetensors", ".json", ".jinja", ".tiktoken", ".model"))
            or name in ("merges.txt", "vocab.txt"))
