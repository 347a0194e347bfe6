"""Servers for the remote-model tests: the fake OpenAI-compatible one (``tests.app.fake_openai``)
as a real process on a chosen 127.0.0.1 port."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PlainServer:
    """``python -m tests.app.fake_openai``; ``lines`` is what it printed."""

    def __init__(self, port: int | None = None, *, words: int = 20, delay: float = 0.0,
                 think: bool = False) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lines: list[str] = []
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.app.fake_openai", "--port", str(self.port),
             "--words", str(words), "--delay", str(delay), *(["--think"] if think else [])],
            cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=lambda: self.lines.extend(
            line.strip() for line in self.proc.stdout), daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 60
        while "ready" not in self.lines:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the fake server did not start: {self.lines[-5:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.reader.join(5)
        self.proc.stdout.close()
