"""Fixtures for the server tests: a real ``python -m engine serve`` process on a free
loopback port serving the embedded demo model (one per module), and the same model loaded
in-process as the reference."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, url: str, model: str) -> None:
        self.proc, self.url, self.model = proc, url, model
        self.stderr: list[str] = []

    def close(self) -> None:
        time.sleep(0.1)  # let the reader threads see EOF
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def stop(self, sig=signal.SIGINT, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_serve(tmp: Path, *args: str, timeout: float = 90, preexec_fn=None,
                env: dict | None = None) -> ServerProcess:
    from engine.server.guard import ORIGINS_ENV

    env = dict({k: v for k, v in os.environ.items() if k != ORIGINS_ENV}, MTPCHAT_HOME=str(tmp),
               PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--json", "--port", "0",
                             *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + timeout
    while not lines and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if not lines:
        proc.kill()
        err = proc.stderr.read()[-2000:]
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
        raise RuntimeError(f"serve did not start: {err}")
    info = json.loads(lines[0])
    server = ServerProcess(proc, info["url"], info["model"])
    threading.Thread(target=lambda: server.stderr.extend(proc.stderr), daemon=True).start()
    return server


@pytest.fixture(scope="module")
def scripted_served():
    """(ScriptedModel, its server on a free loopback port): one reply at a time, two wait."""
    from engine.server.runner import start_server
    from tests.server.fakes import ScriptedModel

    model = ScriptedModel()
    server = start_server(model, port=0, max_queue=2, max_streams=1)
    yield model, server
    server.stop(stop_scheduler=True)


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    server = start_serve(tmp_path_factory.mktemp("home"), "--max-queue", "8",
                         "--drain-seconds", "1")
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(10)
    server.close()


@pytest.fixture(scope="session")
def shared_demo_server(tmp_path_factory):
    """One demo-model server for the modules that only send it requests (no signals, no
    shutdown tests): started once, stopped at the end of the session."""
    server = start_serve(tmp_path_factory.mktemp("shared-home"), "--max-queue", "8")
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(10)
    server.close()


@pytest.fixture(scope="module")
def reference():
    """The demo model in this process, for greedy outputs to compare with."""
    import engine

    return engine.load(engine.default_model_path())
