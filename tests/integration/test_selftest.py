"""``python -m app --self-test`` in a real subprocess (offscreen)."""
from __future__ import annotations

import os
import subprocess
import sys

from engine.resources import default_model_path


def _self_test(tmp_path, *extra: str, env_extra: dict | None = None, timeout: float = 900):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", MTPCHAT_HOME=str(tmp_path / "home"))
    env.pop("MTPCHAT_SELFTEST_FAKE", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "app", "--self-test", *extra],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_self_test_with_the_demo_model(tmp_path):
    demo = default_model_path()
    assert (demo / "model.safetensors").is_file(), f"the embedded demo model is missing: {demo}"
    out = _self_test(tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "self-test: OK" in out.stdout
    assert "persisted" in out.stderr and "acceptance rate" in out.stderr


def test_self_test_plumbing_with_the_fake_engine(tmp_path):
    """The same end-to-end path over the scripted engine: window, worker, stats, SQLite."""
    out = _self_test(tmp_path, env_extra={"MTPCHAT_SELFTEST_FAKE": "1"}, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FAKE engine" in out.stderr and "persisted" in out.stderr


def test_self_test_fails_clearly_without_a_model(tmp_path):
    out = _self_test(tmp_path, "--model", str(tmp_path / "nope"), timeout=180)
    assert out.returncode == 2
    assert "model folder not found" in out.stderr
