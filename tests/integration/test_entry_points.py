"""Each entry point runs in a real subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import engine

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_engine_info_json():
    out = _run("-m", "engine", "info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    for key in ("engine_version", "mlx_version", "mlx_lm_version", "device", "blas",
                "total_bytes", "available_bytes"):
        assert key in info
    assert info["engine_version"] == engine.__version__
    assert info["device"] in ("cpu", "gpu")


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.exists(OPENBLAS)),
                    reason="Linux with Debian's libopenblas0-pthread only")
def test_engine_runs_on_openblas_on_linux():
    out = _run("-m", "engine", "info", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["blas"] == "openblas"


def test_engine_info_human():
    out = _run("-m", "engine", "info")
    assert out.returncode == 0, out.stderr
    assert "BLAS" in out.stdout and "memory" in out.stdout


def test_engine_unknown_verb_fails():
    out = _run("-m", "engine", "no-such-verb")
    assert out.returncode != 0


def test_app_version():
    out = _run("-m", "app", "--version")
    assert out.returncode == 0, out.stderr
    assert engine.__version__ in out.stdout


def test_app_window_opens_and_quits():
    out = _run("-m", "app", "--quit-after", "0.5", timeout=180)
    assert out.returncode == 0, out.stderr
