"""The CPU branch's allocator settings (engine/core/allocator.py): glibc keeps freed memory
for later sizes, and MLX's buffer cache stays small."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core import allocator, memory
from engine.core.memory import MemoryGate

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# buffers of growing sizes, each freed before the next, MLX's own cache off: the page faults
GROWING = """
import sys
import mlx.core as mx
from engine.core import allocator
mx.set_cache_limit(0)
tuned = allocator.reuse_freed_memory()
def faults():
    f = open("/proc/self/stat").read()
    return int(f[f.rindex(")") + 2:].split()[7])
mx.eval(mx.zeros((5 << 20,)))
before = faults()
for mb in range(20, 30):
    a = mx.ones((mb << 18,))
    mx.eval(a)
    del a
print(tuned, faults() - before)
"""


def _growing(tune: str) -> tuple[bool, int]:
    env = dict(os.environ, MTPCHAT_MALLOC_TUNE=tune, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", GROWING], env=env, cwd=ROOT, text=True,
                         capture_output=True, timeout=100, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@linux
def test_freed_memory_serves_the_next_larger_buffer():
    tuned, faults = _growing("1")
    untouched, fresh = _growing("0")
    assert tuned and not untouched
    # untouched: every buffer (20..29 MB) from fresh pages, ~62,000 faults; tuned: the freed
    # buffer grows in place, ~2,600 (one MB a step) plus noise
    assert fresh > 40_000, fresh
    assert faults < fresh / 4, (faults, fresh)


def test_the_switch(monkeypatch):
    monkeypatch.setenv(allocator.TUNE_ENV, "0")
    assert not allocator.enabled()
    monkeypatch.setenv(allocator.TUNE_ENV, "1")
    assert allocator.enabled()
    monkeypatch.delenv(allocator.TUNE_ENV)
    assert allocator.enabled() == sys.platform.startswith("linux")


@pytest.fixture
def mlx_limits():
    """MLX's memory and cache limits as they were before the test."""
    import mlx.core as mx

    memory_limit, cache_limit = mx.get_memory_limit(), mx.set_cache_limit(0)
    mx.set_cache_limit(cache_limit)
    yield
    mx.set_memory_limit(memory_limit)
    mx.set_cache_limit(cache_limit)


@linux
def test_the_gate_keeps_mlx_cache_small_on_the_cpu_branch(tiny_model, monkeypatch, mlx_limits):
    monkeypatch.setattr(memory, "resident_bytes", lambda: 300 * 2**20)
    gate = MemoryGate(64 * 2**30)  # a headroom whose tenth is far above the cap
    gate.attach(tiny_model)
    assert gate.cache_limit == allocator.CPU_CACHE_LIMIT
    monkeypatch.setenv(allocator.TUNE_ENV, "0")
    gate.attach(tiny_model)
    assert gate.cache_limit == int((gate.budget - gate.base) * memory.CACHE_SHARE)
