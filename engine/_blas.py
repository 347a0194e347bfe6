"""Load an optimized BLAS before MLX on Linux.

MLX's Linux wheel links a reference BLAS whose matrix products cost grows linearly with
the number of rows, which would hide any speculative speed-up. Loading OpenBLAS with
global symbol binding *before* MLX is first imported makes MLX's BLAS calls resolve to it.
This module must not import mlx.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
INSTALL_HINT = "sudo apt-get install -y libopenblas0-pthread"

_state: dict[str, str | None] = {"blas": None, "path": None}
_warned = False


def ensure_fast_blas() -> str:
    """Return the name of the BLAS MLX will use ("openblas", "reference", "accelerate")."""
    global _warned
    if _state["blas"] is not None:
        return _state["blas"]
    if sys.platform == "darwin":
        _state["blas"] = "accelerate"
        return "accelerate"
    if not sys.platform.startswith("linux"):
        _state["blas"] = "unknown"
        return "unknown"
    if "mlx.core" in sys.modules:
        log.warning("mlx was imported before engine; cannot swap in OpenBLAS")
    override = os.environ.get("MTPCHAT_BLAS")
    candidates = ([override] if override else []) + list(_CANDIDATES)
    if os.environ.get("MTPCHAT_NO_OPENBLAS") == "1":
        candidates = []
    for path in candidates:
        if path and os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:  # broken install: keep looking
                log.debug("could not load %s: %s", path, exc)
                continue
            _state.update(blas="openblas", path=path)
            log.info("BLAS: OpenBLAS (%s)", path)
            return "openblas"
    _state["blas"] = "reference"
    if not _warned:
        _warned = True
        log.warning(
            "MLX is running on the slow reference BLAS; install OpenBLAS for 3-20x faster "
            "CPU inference: %s", INSTALL_HINT)
    return "reference"


def blas_info() -> dict[str, str | None]:
    ensure_fast_blas()
    return dict(_state)
