"""Clusters of two ranks on 127.0.0.1 (ring backend, CPU) for the tests: ``ClusterServer``
runs ``engine serve --hostfile`` (the launcher, mlx.launch and both ranks in one process
group of their own, ended by its id), ``reference`` the same requests in this process on the
single-process engine."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 300  # imports alone took 100 s at a load average of 20


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive free TCP ports on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free ports")


def write_hostfile(folder: Path, n: int = 2) -> Path:
    path = folder / "hosts.json"
    path.write_text(json.dumps({"backend": "ring", "hosts": [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]} for _ in range(n)]}))
    return path


def env(home: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MTPCHAT_HOME": str(home),
            "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


class ClusterServer:
    """``engine serve`` on two ranks; ``post(path, body)``; ``close()`` ends the group."""

    def __init__(self, tmp: Path, model: Path, *, split: str = "tensor", streams: int = 4,
                 step_timeout: float = 6.0) -> None:
        self.tmp = tmp
        self.port = free_ports(1)
        cport = free_ports(2)
        self.log = tmp / f"serve-{self.port}.log"
        cmd = [sys.executable, "-m", "engine", "serve", "--hostfile", str(write_hostfile(tmp)),
               "--cluster-port", str(cport), "--port", str(self.port), "--model", str(model),
               f"--{split}", "--max-streams", str(streams), "--step-timeout", str(step_timeout)]
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env(tmp), stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.model_id = None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.text()
            if "Serving " in text:
                self.model_id = text.split("Serving ", 1)[1].split(" on ", 1)[0]
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.close()
        raise AssertionError(f"the cluster did not start:\n{self.text()[-3000:]}")

    def text(self) -> str:
        return self.log.read_bytes().decode(errors="replace")

    def post(self, path: str, body: dict, timeout: float = 60) -> dict:
        body = {"model": self.model_id, **body}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, **json.loads(exc.read() or b"{}")}

    def rank_pid(self, rank: int) -> int:
        """The process of ``rank`` (mlx.launch sets MLX_RANK in its environment)."""
        pgid = os.getpgid(self.proc.pid)
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if os.getpgid(int(d.name)) != pgid:
                    continue
                envs = (d / "environ").read_bytes().split(b"\0")
                cmd = (d / "cmdline").read_bytes()
            except (OSError, ProcessLookupError):
                continue
            if f"MLX_RANK={rank}".encode() in envs and b"engine" in cmd:
                return int(d.name)
        raise AssertionError(f"no process of rank {rank}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group: the launcher's ranks too
        except ProcessLookupError:
            pass
        self.proc.wait(5)
        self._out.close()


def completion(ids: list[int], *, depth: int, max_tokens: int = 24, **kw) -> dict:
    return {"prompt": ids, "max_tokens": max_tokens, "mtp": {"depth": depth},
            "temperature": 0, **kw}


def reference(model, ids: list[int], *, depth: int, max_tokens: int = 24,
              temperature: float = 0.0, seed: int | None = None, top_p: float = 1.0) -> str:
    """The single-process engine's text for the same request."""
    from engine import SamplingParams

    params = SamplingParams(temperature=temperature, top_p=top_p)
    return "".join(ev.text for ev in model.generate(ids, max_tokens=max_tokens, depth=depth,
                                                     sampling=params, seed=seed))
