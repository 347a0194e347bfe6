"""The curated catalog of MTP-capable models (``resources/catalog.json``) and per-machine verdicts.

A verdict compares a model's memory need with this machine's *total* memory (Apple-silicon GPUs
share it; macOS lets the GPU wire roughly three quarters of it) and its download with the free
disk space of the model store:

- ``recommended``: needs at most 60% of memory and fits on disk;
- ``tight fit``: needs at most 80% of memory (close other apps);
- ``not enough memory``: needs more than that;
- ``not enough disk``: fits in memory but the download (plus conversion output) does not fit.

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
VERDICTS = ("recommended", "tight fit", "not enough memory", "not enough disk")


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


def memory_verdict(memory_bytes: int, *, total_memory: int | None = None) -> dict:
    total = total_memory if total_memory is not None else globals()["total_memory"]()
    frac = memory_bytes / total if total else float("inf")
    if frac <= RECOMMENDED_FRACTION:
        verdict = "recommended"
    elif frac <= TIGHT_FRACTION:
        verdict = "tight fit"
    else:
        verdict = "not enough memory"
    return {"verdict": verdict, "memory_needed_bytes": int(memory_bytes),
            "total_memory_bytes": int(total), "fraction_of_memory": round(frac, 3)}


def verdict(*, memory_bytes: int, disk_bytes: int, total_mem: int, free: int) -> str:
    v = memory_verdict(memory_bytes, total_memory=total_mem)["verdict"]
    if v != "not enough memory" and disk_bytes * DISK_MARGIN > free:
        return "not enough disk"
    return v


_RANK = {"recommended": 0, "tight fit": 1, "not enough disk": 2, "not enough memory": 3}


def _choice_key(o: dict) -> tuple[int, int]:
    """Best verdict first; among fitting options the highest precision, otherwise the smallest."""
    q = QUANTS.index(o["quantization"])
    return _RANK[o["verdict"]], q if _RANK[o["verdict"]] < 2 else -q


def evaluate(entry: dict, *, total_mem: int, free: int) -> dict:
    """An entry with a verdict per quantization and the best choice for this machine."""
    options = []
    for q in QUANTS:
        spec = (entry.get("quantizations") or {}).get(q)
        if not spec:
            continue
        disk = int(spec["download_bytes"]) + int(spec.get("converted_bytes", 0))
        v = verdict(memory_bytes=int(spec["memory_bytes"]), disk_bytes=disk,
                    total_mem=total_mem, free=free)
        options.append({"quantization": q, "verdict": v, "disk_needed_bytes": disk, **spec})
    best = min(options, key=_choice_key, default=None)
    return {**entry, "options": options,
            "verdict": best["verdict"] if best else "unknown",
            "best_quantization": best["quantization"] if best else None,
            "pull_command": _pull_command(entry, best)}


def _pull_command(entry: dict, best: dict | None) -> str:
    cmd = f"python -m engine pull {entry['repo_id']}"
    if best and best.get("needs_conversion"):
        cmd += f" --convert --bits {best['quantization'].removesuffix('bit')}"
    return cmd


def catalog_for_machine(*, store_root: str | Path | None = None,
                        total_mem: int | None = None,
                        free_fn: Callable[[Path], int] | None = None,
                        path: str | Path | None = None) -> dict:
    """The catalog with verdicts for this machine (memory from psutil, disk at the store)."""
    from engine.paths import store_root as default_store

    root = Path(store_root) if store_root is not None else default_store()
    data = load_catalog(path)
    mem = total_mem if total_mem is not None else total_memory()
    free = (free_fn or free_disk)(root)
    return {
        "machine": {"total_memory_bytes": mem, "free_disk_bytes": free, "store": str(root)},
        "notes": data.get("notes", []),
        "models": [evaluate(e, total_mem=mem, free=free) for e in data["models"]],
        "without_mtp": data.get("without_mtp", []),
    }


def warning_for(repo_id: str, *, path: str | Path | None = None) -> str | None:
    """A known warning (e.g. 'mlx-community conversions drop MTP') for a repo id, if any."""
    import fnmatch

    for w in load_catalog(path).get("without_mtp", []):
        if fnmatch.fnmatch(repo_id.lower(), w["pattern"].lower()):
            return w["why"]
    return None
