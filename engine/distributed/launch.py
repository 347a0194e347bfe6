"""Starting a cluster: the hostfile, checked, and the ``mlx.launch`` command that runs this
same engine command on every host.

``engine serve --hostfile hosts.json`` (or ``generate``) is run once, on the machine that will
be rank 0. Without ``MLX_RANK`` in its environment it is the *launcher*: it checks the hostfile
and the model folder here (one line for each problem), then runs ``mlx.launch --hostfile ...
-- -m engine serve ...`` with the same arguments, which starts one process per host (over SSH,
or directly for 127.0.0.1). Each of those has ``MLX_RANK`` set and joins the cluster
(``engine.distributed.node``).

The hostfile is mlx.launch's own format (what ``mlx.distributed_config --over thunderbolt
--auto-setup`` writes): a JSON object with ``hosts`` (each ``{"ssh": NAME, "ips": [IP, ...]}``),
optionally ``backend`` and ``envs``; or just the list of hosts.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import sys
from pathlib import Path

from engine.errors import ClusterError

BACKENDS = ("ring", "jaccl", "mpi")
DEFAULT_PORT = 32323  # mlx.launch's own default for the ring backend
FORWARDED_ENV = ("PYTHONPATH", "MTPCHAT_HOME", "OPENBLAS_NUM_THREADS", "HF_HOME",
                 "HF_HUB_CACHE", "MTPCHAT_MODEL_DIRS")


def in_cluster() -> bool:
    """Whether this process was started by ``mlx.launch`` (it sets ``MLX_RANK``)."""
    return "MLX_RANK" in os.environ


def read_hostfile(path: str | Path) -> tuple[list[dict], str]:
    """The hosts and the backend the hostfile names ("" when it names none), or a one-line
    ``ClusterError``."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ClusterError(f"cannot read the hostfile {p}: {why}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClusterError(f"the hostfile {p} is not JSON ({exc.msg} at line {exc.lineno}); "
                           "see `mlx.distributed_config --help` to write one") from None
    hosts, backend = (data.get("hosts"), data.get("backend", "")) \
        if isinstance(data, dict) else (data, "")
    if not isinstance(hosts, list) or not all(isinstance(h, dict) for h in hosts):
        raise ClusterError(f"the hostfile {p} has no list of hosts: expected "
                           '{"hosts": [{"ssh": "mac1", "ips": ["10.0.0.1"]}, ...]}')
    if len(hosts) < 2:
        raise ClusterError(f"the hostfile {p} lists {len(hosts)} host(s): a cluster needs "
                           "at least two")
    if backend not in ("", *BACKENDS):
        raise ClusterError(f"the hostfile {p} names backend {backend!r}: one of "
                           f"{', '.join(BACKENDS)}")
    for i, h in enumerate(hosts):
        ssh, ips = h.get("ssh"), h.get("ips", [])
        if not isinstance(ssh, str) or not ssh:
            raise ClusterError(f"the hostfile {p}: host {i} has no \"ssh\" name")
        if not isinstance(ips, list) or not all(isinstance(a, str) for a in ips):
            raise ClusterError(f"the hostfile {p}: host {i} ({ssh}): \"ips\" must be a list "
                               "of addresses")
        for a in ips:
            try:
                ipaddress.ip_address(a)
            except ValueError:
                raise ClusterError(f"the hostfile {p}: host {i} ({ssh}): {a!r} is not an IP "
                                   "address") from None
    return hosts, backend


def launcher() -> list[str]:
    """How to run ``mlx.launch`` with this Python."""
    exe = Path(sys.executable).parent / "mlx.launch"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("mlx.launch")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; "
            "sys.exit(main())"]


def launch_command(argv: list[str], hostfile: str, *, backend: str | None,
                   port: int = DEFAULT_PORT) -> list[str]:
    """``mlx.launch`` running ``python -m engine ARGV`` on every host of ``hostfile``
    (``argv``: this command's own arguments, passed on unchanged)."""
    hosts, named = read_hostfile(hostfile)
    backend = backend or named or "ring"
    if backend == "ring" and any(not h.get("ips") for h in hosts):
        raise ClusterError("the ring backend needs \"ips\" for every host in the hostfile "
                           "(the addresses the hosts reach each other on)")
    cmd = [*launcher(), "--hostfile", str(Path(hostfile).expanduser()), "--backend", backend,
           "--python", sys.executable, "--cwd", os.getcwd()]
    if backend == "ring":
        cmd += ["--starting-port", str(port)]
    for key in FORWARDED_ENV:
        if os.environ.get(key):
            cmd += ["--env", f"{key}={os.environ[key]}"]
    cmd += ["--env", "MTPCHAT_PROMPT_DISK_CACHE=0"]  # ranks may share a disk: keep none
    return [*cmd, "--", "-m", "engine", *argv]


def add_arguments(p) -> None:
    """The options ``generate`` and ``serve`` take to run on several machines."""
    g = p.add_argument_group("several machines (see docs/distributed.md)")
    g.add_argument("--hostfile", default=None, help="run on the hosts of this mlx.launch "
                   "hostfile (JSON), started through mlx.launch; rank 0 is the first host")
    g.add_argument("--backend", choices=BACKENDS, default=None, help="MLX's distributed "
                   "backend (default: the hostfile's, else ring)")
    split = g.add_mutually_exclusive_group()
    split.add_argument("--tensor", dest="split", action="store_const", const="tensor",
                       help="tensor parallel: every layer split across the hosts (default)")
    split.add_argument("--pipeline", dest="split", action="store_const", const="pipeline",
                       help="pipeline parallel: each host runs a contiguous part of the layers")
    g.add_argument("--cluster-port", type=int, default=DEFAULT_PORT, help="ring backend: "
                   f"the first port the ranks listen on (default {DEFAULT_PORT})")
    g.add_argument("--mtp-head", choices=("every", "rank0"), default="every",
                   help="every rank keeps the MTP head (default), or only rank 0 drafts "
                   "(generate only, for measuring: see docs/distributed.md)")
    g.add_argument("--step-timeout", type=float, default=8.0, help="seconds a step may wait "
                   "for the other hosts before the cluster is declared gone (default 8)")


def run_launcher(argv: list[str], args) -> int:
    """The launcher: check here what can be checked, then run ``mlx.launch``."""
    import subprocess

    from engine.distributed.family import sharder
    from engine.hub.store import resolve_model
    from engine.models.checkpoint import read_checkpoint

    cmd = launch_command(argv, args.hostfile, backend=args.backend, port=args.cluster_port)
    ckpt = read_checkpoint(resolve_model(args.model or _demo()))
    sharder(ckpt.config.family)
    try:
        return subprocess.run(cmd, check=False).returncode
    except KeyboardInterrupt:
        return 130


def _demo() -> str:
    from engine import default_model_path

    return str(default_model_path())
