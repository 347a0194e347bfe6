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


def test_self_test_ignores_and_keeps_the_saved_settings(tmp_path, monkeypatch):
    """A saved "serve whenever a model is loaded" does not start the local server during
    ``--self-test`` (its port is held here: a server would warn that it is taken), and the
    self-test writes none of the user's settings (window sizes, preferences, the server's)."""
    import socket
    import sqlite3

    from app.db import ChatStore
    from app.paths import db_path

    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    store = ChatStore(db_path())
    store.set_setting("local_server", {"enabled": True, "port": port})
    store.set_setting("defaults", {"max_tokens": 1, "system_prompt": "Answer in Latin."})
    store.close()

    def saved() -> dict:
        with sqlite3.connect(db_path()) as db:
            rows = dict(db.execute("SELECT key, value FROM app_settings"))
        rows.pop("last_opened", None)  # the store's own write probe on opening, no setting
        return rows

    before = saved()
    try:
        out = _self_test(tmp_path, env_extra={"MTPCHAT_SELFTEST_FAKE": "1"}, timeout=180)
    finally:
        held.close()
    assert out.returncode == 0, out.stderr[-3000:]
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "home").rglob("*.log"))
    assert str(port) not in out.stderr + out.stdout and str(port) not in logs, out.stderr
    assert "server" not in out.stderr.lower(), out.stderr
    assert saved() == before  # nothing saved: not even the window's geometry
