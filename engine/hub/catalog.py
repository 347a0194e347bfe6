"""The curated catalog of MTP-capable models (``resources/catalog.json``) and per-machine verdicts.

A verdict compares a model's memory need with this machine's *total* memory (Apple-silicon GPUs
share it; macOS lets the GPU wire roughly three quarters of it) and its download with the free
disk space of the model store:

- ``recommended``: needs at most 60% of memory and fits on disk;
- ``tight fit``: needs at most 80% of memory (close other apps);
- ``not enough memory``: needs more than that;
- ``not enough disk``: fits in memory but the download (plus conversion output) does not fit;
- ``too slow``: fits, but this machine would decode it below ``TOO_SLOW_TOK_S``. Speed is
  estimated from the machine's measured memory bandwidth (``engine.sysinfo.machine_figures``):
  a decode step reads every active weight once, so tok/s ~ bandwidth x efficiency / bytes.
  A 9B bf16 model on a 2-core CPU (~10 GB/s) is about 0.4 tok/s: too slow, not recommended.
  Verdicts judge memory only when a caller injects the memory size without machine figures.

Sizes in the catalog are estimates computed from the published parameter counts (the catalog
says so per entry); ``python -m engine inspect REPO`` reads the real numbers from the Hub.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from engine.errors import EngineError
from engine.resources import resources_dir

RECOMMENDED_FRACTION = 0.60
TIGHT_FRACTION = 0.80
DISK_MARGIN = 1.02  # keep 2% headroom on disk
QUANTS = ("bf16", "8bit", "4bit")
VERDICTS = ("recommended", "tight fit", "too slow", "not enough memory", "not enough disk")
TOO_SLOW_TOK_S = 3.0
BANDWIDTH_EFFICIENCY = 0.7  # decode reaches about this share of the measured bandwidth


def catalog_path() -> Path:
    return resources_dir() / "catalog.json"


def load_catalog(path: str | Path | None = None) -> dict:
    try:
        data = json.loads(Path(path or catalog_path()).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read the model catalog: {exc}") from exc
    if not isinstance(data.get("models"), list):
        raise EngineError("the model catalog has no 'models' list")
    return data


def total_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def free_disk(path: str | Path) -> int:
    """Free bytes on the disk holding ``path`` (its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return int(shutil.disk_usage(p).free)


def memory_verdict(memory_bytes: int, *, total_memory: int | None = None,
                   active_bytes: int = 0, machine: dict | None = None) -> dict:
    """Memory verdict; with ``machine`` figures and ``active_bytes``, also "too slow"."""
    total = total_memory if total_memory is not None else globals()["total_memory"]()
    frac = memory_bytes / total if total else float("inf")
    if frac <= RECOMMENDED_FRACTION:
        verdict = "recommended"
    elif frac <= TIGHT_FRACTION:
        verdict = "tight fit"
    else:
        verdict = "not enough memory"
    verdict, tok_s = speed_verdict(verdict, active_bytes, machine)
    return {"verdict": verdict, "memory_needed_bytes": int(memory_bytes),
            "total_memory_bytes": int(total), "fraction_of_memory": round(frac, 3),
            "estimated_tok_s": round(tok_s, 1) if tok_s is not None else None}


def estimated_tok_s(active_bytes: int, machine: dict | None) -> float | None:
    """Decode tokens per second this machine would reach reading ``active_bytes`` per token."""
    bw = (machine or {}).get("bandwidth_bytes_per_s")
    if not bw or not active_bytes:
        return None
    return float(bw) * BANDWIDTH_EFFICIENCY / active_bytes


def speed_verdict(base: str, active_bytes: int, machine: dict | None) -> tuple[str, float | None]:
    """``base`` (a memory verdict), or "too slow" when it fits but would crawl here."""
    tok_s = estimated_tok_s(active_bytes, machine)
    if base in ("recommended", "tight fit") and tok_s is not None and tok_s < TOO_SLOW_TOK_S:
        return "too slow", tok_s
    return base, tok_s


def verdict(*, memory_bytes: int, disk_bytes: int, total_mem: int, free: int,
            active_bytes: int = 0, machine: dict | None = None) -> str:
    v = memory_verdict(memory_bytes, total_memory=total_mem)["verdict"]
    v = speed_verdict(v, active_bytes, machine)[0]
    if v != "not enough memory" and disk_bytes * DISK_MARGIN > free:
        return "not enough disk"
    return v


_RANK = {"recommended": 0, "tight fit": 1, "too slow": 2, "not enough disk": 3,
         "not enough memory": 4}


def _choice_key(o: dict) -> tuple[int, int]:
    """Best verdict first; among fitting options the highest precision, otherwise the smallest."""
    q = QUANTS.index(o["quantization"])
    return _RANK[o["verdict"]], q if _RANK[o["verdict"]] < 2 else -q


def active_fraction(entry: dict) -> float:
    """Share of the weights a MoE reads per token: the entry's ``active_parameters_b`` (counted
    from the config), else the repo name's ("35B-A3B": 3 / 35.9); 1 for dense models."""
    import re

    if not entry.get("moe"):
        return 1.0
    total = float(entry.get("parameters_b") or 0)
    active = entry.get("active_parameters_b")
    if active and total:
        return min(1.0, float(active) / total)
    m = re.search(r"-A([0-9.]+)B", str(entry.get("repo_id", "")))
    return min(1.0, float(m.group(1)) / total) if m and total else 1.0


def evaluate(entry: dict, *, total_mem: int, free: int, machine: dict | None = None) -> dict:
    """An entry with a verdict per quantization and the best choice for this machine."""
    options = []
    for q in QUANTS:
        spec = (entry.get("quantizations") or {}).get(q)
        if not spec:
            continue
        disk = int(spec["download_bytes"]) + int(spec.get("converted_bytes", 0))
        weights = int(spec.get("converted_bytes") or spec["download_bytes"])
        active = int(weights * active_fraction(entry))
        v = verdict(memory_bytes=int(spec["memory_bytes"]), disk_bytes=disk,
                    total_mem=total_mem, free=free, active_bytes=active, machine=machine)
        tok_s = estimated_tok_s(active, machine)
        options.append({"quantization": q, "verdict": v, "disk_needed_bytes": disk,
                        "estimated_tok_s": round(tok_s, 1) if tok_s else None, **spec})
    best = min(options, key=_choice_key, default=None)
    return {**entry, "options": options,
            "verdict": best["verdict"] if best else "unknown",
            "best_quantization": best["quantization"] if best else None,
            "pull_command": _pull_command(entry, best)}


# hidden, FFN, query heads, KV heads of the dense models (MTP_SPEC §1; head_dim 256): the MTP
# head's size follows (fc [H, 2H], one gated full-attention layer, its MLP, five norms).
HEAD_SHAPES = {"0.8B": (1024, 3584, 8, 2), "2B": (2048, 6144, 8, 2), "4B": (2560, 9216, 16, 4),
               "9B": (4096, 12288, 16, 4), "27B": (5120, 17408, 24, 4)}
GRAFT_QUANTS = ("8bit", "4bit")


def head_bytes_estimate(repo_id: str) -> int | None:
    """The bf16 MTP head of an official dense repo, from its published shape (None if unknown)."""
    import re

    m = re.search(r"-([0-9.]+B)$", repo_id)
    shape = HEAD_SHAPES.get(m.group(1)) if m else None
    if shape is None:
        return None
    h, ffn, q, kv = shape
    d = 256
    params = 2 * h * h + (2 * q * d) * h + 2 * (kv * d) * h + h * (q * d) + 3 * h * ffn
    params += 5 * h + 2 * d
    return 2 * params


def graft_options(entry: dict, *, total_mem: int, free: int, machine: dict | None) -> list[dict]:
    """The mlx-community conversion plus only its MTP head (``engine graft``): what it
    downloads — the head's real size once an offer was read from the Hub's headers, else the
    estimate from the published shape."""
    from engine.hub.graft_source import cached_offer

    repo = entry["repo_id"]
    offer = cached_offer(repo)
    head = int(offer["bytes"]) if offer and offer.get("bytes") else head_bytes_estimate(repo)
    if not head:
        return []
    out = []
    for q in GRAFT_QUANTS:
        spec = (entry.get("quantizations") or {}).get(q) or {}
        conv = int(spec.get("converted_bytes") or 0)
        if not conv:
            continue
        conv_repo = f"mlx-community/{repo.split('/', 1)[1]}-{q}"
        memory = int(spec["memory_bytes"]) + head // 2  # the head kept at 8 bits
        v = verdict(memory_bytes=memory, disk_bytes=conv + head, total_mem=total_mem, free=free,
                    active_bytes=int(conv * active_fraction(entry)), machine=machine)
        out.append({"quantization": q, "conversion_repo": conv_repo, "head_from": repo,
                    "download_bytes": conv + head, "head_bytes": head,
                    "head_bytes_measured": bool(offer and offer.get("bytes")),
                    "memory_bytes": memory, "verdict": v,
                    "command": f"python -m engine pull {conv_repo} && "
                               f"python -m engine graft {conv_repo}"})
    return out


def _pull_command(entry: dict, best: dict | None) -> str:
    cmd = f"python -m engine pull {entry['repo_id']}"
    if best and best.get("needs_conversion"):
        cmd += f" --convert --bits {best['quantization'].removesuffix('bit')}"
    return cmd


def figures_for(total_mem: int | None, machine: dict | None) -> dict | None:
    """The machine figures to judge speed by: given ones, else measured (cached) — unless the
    caller injected a memory size alone (then verdicts judge memory only)."""
    if machine is not None or total_mem is not None:
        return machine
    from engine.sysinfo import machine_figures

    return machine_figures()


def catalog_for_machine(*, store_root: str | Path | None = None,
                        total_mem: int | None = None,
                        free_fn: Callable[[Path], int] | None = None,
                        path: str | Path | None = None, machine: dict | None = None) -> dict:
    """The catalog with verdicts for this machine (memory from psutil, disk at the store,
    speed from the machine's measured bandwidth)."""
    from engine.paths import store_root as default_store
    from engine.sysinfo import platform_name

    root = Path(store_root) if store_root is not None else default_store()
    data = load_catalog(path)
    figures = figures_for(total_mem, machine)
    mem = total_mem if total_mem is not None else total_memory()
    free = (free_fn or free_disk)(root)
    return {
        "machine": {"total_memory_bytes": mem, "free_disk_bytes": free, "store": str(root),
                    "name": (figures or {}).get("name") or platform_name(),
                    "bandwidth_bytes_per_s": (figures or {}).get("bandwidth_bytes_per_s")},
        "notes": data.get("notes", []),
        "models": [{**evaluate(e, total_mem=mem, free=free, machine=figures),
                    "graft": graft_options(e, total_mem=mem, free=free, machine=figures)}
                   for e in data["models"]],
        "without_mtp": data.get("without_mtp", []),
    }


def warning_for(repo_id: str, *, path: str | Path | None = None) -> str | None:
    """A known warning (e.g. 'mlx-community conversions drop MTP') for a repo id, if any."""
    import fnmatch

    for w in load_catalog(path).get("without_mtp", []):
        if fnmatch.fnmatch(repo_id.lower(), w["pattern"].lower()):
            return w["why"]
    return None
