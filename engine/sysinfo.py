"""Facts about the machine the engine runs on: versions, device, BLAS, memory, speed.

:func:`machine_figures` is what verdicts judge speed by: the memory bandwidth a decode step
sees, measured once per machine (a float32 4096 x 4096 matrix-vector product streams 64 MiB,
about what a bandwidth-bound decode step does per token) and cached in the data dir.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import logging
import os
import platform
import threading
import time
from pathlib import Path

from engine._blas import blas_info


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def memory() -> dict[str, int]:
    import psutil

    vm = psutil.virtual_memory()
    return {"total_bytes": int(vm.total), "available_bytes": int(vm.available)}


def system_info() -> dict:
    import mlx.core as mx

    from engine import __version__
    from engine.models import cpu_products, device

    blas = blas_info()
    dev = mx.default_device()
    return {
        "engine_version": __version__,
        "mlx_version": getattr(mx, "__version__", _version("mlx")),
        "mlx_lm_version": _version("mlx-lm"),
        "device": "gpu" if dev.type == mx.DeviceType.gpu else "cpu",
        "metal_available": bool(mx.metal.is_available()),
        "device_branch": device.branch(),
        "blas": blas["blas"],
        "blas_path": blas["path"],
        "blas_core": cpu_products.core_name() or None,
        "block_products": cpu_products.enabled(),
        "column_weights": cpu_products.columns_enabled(),
        **memory(),
    }


def matmul_bench(n: int = 4096, rows: tuple[int, ...] = (1, 8, 32), repeats: int = 10) -> dict:
    """Median milliseconds of an (r x n) @ (n x n) float32 product for each r."""
    import mlx.core as mx

    w = mx.random.normal((n, n))
    mx.eval(w)
    out: dict[str, float] = {}
    for r in rows:
        x = mx.random.normal((r, n))
        mx.eval(x)
        for _ in range(2):
            mx.eval(x @ w)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            mx.eval(x @ w)
            times.append(time.perf_counter() - t0)
        times.sort()
        out[str(r)] = round(1000 * times[len(times) // 2], 3)
    ratio = out[str(rows[-1])] / max(out[str(rows[0])], 1e-9)
    return {"size": n, "ms_by_rows": out, "ratio_last_to_first": round(ratio, 2)}


FIGURES_FILE = "machine_figures.json"
_FIGURES_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def platform_name() -> str:
    """How the UI names this computer: "This Mac" on macOS, else "This machine (Linux)"."""
    system = platform.system()
    if system == "Darwin":
        return "This Mac"
    return f"This machine ({system or 'unknown system'})"


def _figures_key() -> str:
    import psutil

    mem = round(psutil.virtual_memory().total / 2**30)
    return f"{platform.system()}-{platform.machine()}-{os.cpu_count()}cpu-{mem}GiB"


def measure_bandwidth(n: int = 4096, repeats: int = 5) -> float:
    """Bytes per second a (1 x n) @ (n x n) float32 product streams (median of ``repeats``)."""
    ms = matmul_bench(n=n, rows=(1,), repeats=repeats)["ms_by_rows"]["1"]
    return n * n * 4 / max(ms / 1000, 1e-9)


def machine_figures(*, refresh: bool = False) -> dict:
    """``{"bandwidth_bytes_per_s", "cores", "platform", "name", "measured_at"}``, measured once
    per machine and kept in ``<data dir>/machine_figures.json``. Thread-safe (concurrent
    callers, e.g. the search's header checks, measure once); an unwritable data dir only
    means the figures are measured again next time."""
    with _FIGURES_LOCK:
        return _machine_figures(refresh)


def _machine_figures(refresh: bool) -> dict:
    from engine.paths import data_dir

    key = _figures_key()
    try:
        path: Path | None = data_dir() / FIGURES_FILE
    except OSError:  # no data dir: measure every time
        path = None
    try:
        cached = json.loads(path.read_text(encoding="utf-8")).get(key) if path else None
    except (OSError, ValueError, AttributeError):
        cached = None
    if isinstance(cached, dict) and not refresh and cached.get("bandwidth_bytes_per_s"):
        return cached
    figures = {"bandwidth_bytes_per_s": round(measure_bandwidth()), "cores": os.cpu_count(),
               "platform": platform.system(), "name": platform_name(),
               "measured_at": time.time()}
    if path is not None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps({key: figures}), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot keep the machine figures in %s: %s", path, exc)
    return figures
