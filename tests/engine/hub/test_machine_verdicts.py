"""Issue 16 defect 8: verdicts judge speed too, from the machine's measured figures."""
from __future__ import annotations

import platform

import pytest

from engine import sysinfo
from engine.hub import catalog
from engine.hub.inspection import machine_verdict

GiB = 2**30
TWO_CORE_CPU = {"bandwidth_bytes_per_s": 8e9, "cores": 2, "name": "This machine (Linux)"}
M4_MAX = {"bandwidth_bytes_per_s": 500e9, "cores": 16, "name": "This Mac"}


def _cat(machine):
    cat = catalog.catalog_for_machine(total_mem=128 * GiB, free_fn=lambda p: 10**13,
                                      machine=machine)
    return {m["repo_id"]: m for m in cat["models"]}, cat["machine"]


def test_nine_b_on_a_two_core_cpu_is_too_slow_not_recommended():
    models, machine = _cat(TWO_CORE_CPU)
    nine = models["Qwen/Qwen3.5-9B"]
    assert {o["verdict"] for o in nine["options"]} == {"too slow"}
    assert all(o["estimated_tok_s"] < catalog.TOO_SLOW_TOK_S for o in nine["options"])
    assert nine["verdict"] == "too slow" and nine["best_quantization"] == "4bit"  # fastest
    small = models["Qwen/Qwen3.5-0.8B"]
    assert small["verdict"] == "recommended"  # 4-bit 0.8B still decodes fast enough here
    assert machine["name"] == "This machine (Linux)"


def test_a_fast_mac_recommends_it_and_moe_reads_only_active_experts():
    models, _ = _cat(M4_MAX)
    assert models["Qwen/Qwen3.5-9B"]["verdict"] == "recommended"
    moe = next(o for o in models["Qwen/Qwen3.5-35B-A3B"]["options"] if o["quantization"] == "4bit")
    dense = next(o for o in models["Qwen/Qwen3.5-27B"]["options"] if o["quantization"] == "4bit")
    assert moe["estimated_tok_s"] > 5 * dense["estimated_tok_s"]


def test_memory_only_when_only_memory_is_injected():
    models, _ = _cat(None)
    assert models["Qwen/Qwen3.5-9B"]["verdict"] == "recommended"


def test_inspect_verdict_uses_speed(tmp_path):
    r = machine_verdict(20 * GiB, total_memory=128 * GiB, active_bytes=18 * GiB,
                        machine=TWO_CORE_CPU)
    assert r["verdict"] == "too slow" and r["estimated_tok_s"] < 1
    assert machine_verdict(20 * GiB, total_memory=16 * GiB, active_bytes=18 * GiB,
                           machine=TWO_CORE_CPU)["verdict"] == "not enough memory"


def test_figures_are_measured_once_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(sysinfo, "measure_bandwidth", lambda: calls.append(1) or 12e9)
    a = sysinfo.machine_figures()
    b = sysinfo.machine_figures()
    assert calls == [1] and a == b and a["bandwidth_bytes_per_s"] == 12e9


@pytest.mark.parametrize("system,name", [("Darwin", "This Mac"),
                                         ("Linux", "This machine (Linux)")])
def test_platform_name(monkeypatch, system, name):
    monkeypatch.setattr(platform, "system", lambda: system)
    assert sysinfo.platform_name() == name


def test_real_measurement_is_plausible(monkeypatch, tmp_path):
    bw = sysinfo.measure_bandwidth(n=1024, repeats=3)
    assert 1e8 < bw < 1e13
