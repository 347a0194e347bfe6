"""Facts about the machine the engine runs on: versions, device, BLAS, memory."""
from __future__ import annotations

import importlib.metadata as md
import time

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

    blas = blas_info()
    dev = mx.default_device()
    return {
        "engine_version": __version__,
        "mlx_version": getattr(mx, "__version__", _version("mlx")),
        "mlx_lm_version": _version("mlx-lm"),
        "device": "gpu" if dev.type == mx.DeviceType.gpu else "cpu",
        "metal_available": bool(mx.metal.is_available()),
        "blas": blas["blas"],
        "blas_path": blas["path"],
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
