"""Freed memory reused on the CPU branch, instead of fresh pages from the kernel.

MLX's CPU allocator is the C library's ``malloc`` behind a buffer cache that hands a freed
buffer back only for a request of its own size (within two pages). A conversation's buffers
change size every turn: the attention caches grow by the turn's tokens, a prefill chunk's
temporaries by the keys it attends to. So with the cache as large as the Metal branch keeps it
(a tenth of the budget's headroom, 1.66 GB here), it filled with buffers of sizes nobody asked
for again, glibc never saw them freed, and every new size came from fresh pages: on a 2-core
Linux VM a fresh page cost 2-20 us to fault in. Replaying an agent session to 12k tokens in one
process, 13 turns: 383,000 page faults and 1.2 GB resident.

``reuse_freed_memory()`` (Linux with glibc; the CPU branch only):
- MLX's buffer cache is capped at ``CPU_CACHE_LIMIT`` (``MemoryGate`` sets it): a decode step's
  temporaries, the same sizes step after step, still come from it;
- glibc keeps what MLX frees for any later size: ``M_MMAP_THRESHOLD`` fixed at its maximum
  (32 MiB; by default it adapts, and a freed block above it goes back to the kernel) and
  ``M_TRIM_THRESHOLD`` at ``TRIM_BYTES`` (free memory at a heap's top kept before it is given
  back).
The same 13 turns: 200,000-209,000 faults and 0.46-0.58 GB resident (a cache of 32-128 MB);
short replies decode as fast as before (a cache of 0 cost them 6 %: docs/benchmarks.md).
``MTPCHAT_MALLOC_TUNE=0`` leaves both as they were.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

CPU_CACHE_LIMIT = 64 << 20  # MLX's buffer cache on the CPU branch, at most
MMAP_THRESHOLD = 32 << 20    # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_BYTES = 256 << 20
TUNE_ENV = "MTPCHAT_MALLOC_TUNE"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_done: bool | None = None


def enabled() -> bool:
    """Whether the allocator is tuned: on the CPU branch, ``$MTPCHAT_MALLOC_TUNE`` (0 or 1),
    else on Linux."""
    from engine.models import cpu_products, device

    return device.is_cpu() and cpu_products.switch_once(
        TUNE_ENV, sys.platform.startswith("linux"), "deciding by the platform")


def reuse_freed_memory() -> bool:
    """Set glibc's thresholds (above) once per process; True when they are set. A C library
    without ``mallopt`` (musl, macOS) or a refused value leaves everything as it was."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if not enabled():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: the allocator is left as it is")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))
    if not _done:
        log.debug("mallopt refused the thresholds: the allocator is left as it is")
    return _done
