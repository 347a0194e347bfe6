"""A cluster the app helps start (no Qt): the hosts, backend, split and model the user chose,
written as mlx.launch's hostfile and turned into the ``engine serve --hostfile`` command.

The hostfile is checked by the very function ``engine serve --hostfile`` reads it with
(``engine.distributed.launch.read_hostfile``), before it replaces the old one: a broken plan
is refused with that function's one line and nothing is written. It goes to the app's own
data folder (``<data>/cluster/hosts.json``) unless the user picks another path.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine.distributed.launch import DEFAULT_PORT, read_hostfile
from engine.errors import ClusterError

LOCAL = ("127.0.0.1", "localhost", "::1")
STEP_TIMEOUT_S = 8.0  # ``engine serve``'s default


@dataclass(frozen=True)
class ClusterPlan:
    hosts: tuple[tuple[str, str], ...]  # (ssh name, IP address); rank 0 first
    backend: str = "ring"
    split: str = "tensor"  # or "pipeline"
    model: str = ""
    port: int = 8080
    api_key: str = field(default="", repr=False)
    cluster_port: int = DEFAULT_PORT  # ring: the first port the ranks listen on
    step_timeout: float = STEP_TIMEOUT_S  # how long a step waits for the other hosts

    def hostfile(self) -> dict:
        """mlx.launch's format: ``{"backend", "hosts": [{"ssh", "ips"}]}``."""
        return {"backend": self.backend, "hosts": [
            {"ssh": ssh.strip(), "ips": [ip.strip()] if ip.strip() else []}
            for ssh, ip in self.hosts]}

    def write(self, path: Path) -> Path:
        """Write the hostfile to ``path`` if ``read_hostfile`` accepts it, else raise its
        one-line ``ClusterError`` and leave ``path`` as it was."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".new")
        tmp.write_text(json.dumps(self.hostfile(), indent=2) + "\n", encoding="utf-8")
        try:
            hosts, backend = read_hostfile(tmp)
            if (backend or "ring") == "ring" and any(not h.get("ips") for h in hosts):
                raise ClusterError("the ring backend needs an IP address for every host "
                                   "(the address the hosts reach each other on)")
            if not self.model.strip():
                raise ClusterError("choose the model folder (the same path on every host)")
        except ClusterError as exc:
            tmp.unlink(missing_ok=True)
            raise ClusterError(str(exc).replace(str(tmp), path.name)) from None
        os.replace(tmp, path)
        return path

    def command(self, hostfile: Path) -> list[str]:
        """``engine serve`` on the cluster, run on the first host (rank 0)."""
        cmd = [sys.executable, "-m", "engine", "serve", "--hostfile", str(hostfile),
               "--backend", self.backend, f"--{self.split}", "--model", self.model.strip(),
               "--port", str(self.port)]
        if self.backend == "ring" and self.cluster_port != DEFAULT_PORT:
            cmd += ["--cluster-port", str(self.cluster_port)]
        if self.step_timeout != STEP_TIMEOUT_S:
            cmd += ["--step-timeout", f"{self.step_timeout:g}"]
        if self.api_key:  # reachable from other machines only with a key
            cmd += ["--host", "0.0.0.0", "--api-key", self.api_key]
        return cmd

    def shown_command(self, hostfile: Path, *, mask: bool = False) -> str:
        """The command as a shell line (``mask``: the API key as dots, for the screen)."""
        line = shlex.join(self.command(hostfile))
        return line.replace(shlex.quote(self.api_key), "••••••") if mask and self.api_key \
            else line

    def runs_here(self) -> bool:
        """Whether rank 0 (the first host) is this machine: the command must run there."""
        import socket

        first = {x.strip() for x in self.hosts[0]} if self.hosts else set()
        return bool(first & {*LOCAL, socket.gethostname()})

    def server_url(self, printed_url: str) -> str:
        """Where this machine reaches the server ``engine serve`` said it listens on."""
        host0 = (self.hosts[0][1] or self.hosts[0][0]).strip()
        if "0.0.0.0" in printed_url and host0 not in LOCAL:
            return printed_url.replace("0.0.0.0", host0)
        return printed_url.replace("0.0.0.0", "127.0.0.1")


def default_hostfile() -> Path:
    from engine.paths import app_dir

    return app_dir("data", create=False) / "cluster" / "hosts.json"  # made when written
