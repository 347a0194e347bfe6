"""Hardening suite, engine side (issue 12): bad inputs built here, run through the CLI, the API
and the store. Every case asserts the exit code (or the error class), that no ``Traceback``
reaches the user and that the message names the problem. CLI cases run in child processes
(``cli_batch``), so a native crash or a hang fails the test instead of killing the test run.

Fixtures: tiny models to break, an app home with installed models, a fake Hub, the batch.

``batch`` runs every case of ``cases.CASES`` through ``python -m tests.reliability.cli_batch``
(one child process) and hands each test its own result.
"""
from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability import broken
from tests.reliability.cases import CASES, INSTALLED, RM_BUSY
from tests.tinymodels import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
BATCH_TIMEOUT_S = 240
ONE_CASE_TIMEOUT_S = 40
MEMORY_LIMIT = 8 * 2**30


@pytest.fixture(scope="session")
def bases(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bases")
    return {"tiny": build_tiny_model(d / "tiny"),
            "sharded": build_tiny_model(d / "sharded", shards=2)}


def make_variant(bases: dict[str, Path], where: Path, base: str, edit) -> Path:
    folder = where / "m"
    shutil.copytree(bases[base], folder, symlinks=True)
    if edit is not None:
        edit(folder)
    return folder


def _install(root: Path, src: Path, name: str, repo_id: str) -> None:
    """Put ``src`` in the store as ``pull`` would (marker written last, then renamed)."""
    staging = root / ".partial" / name
    shutil.copytree(src, staging)
    files = {p.name: {"size": p.stat().st_size} for p in staging.iterdir() if p.is_file()}
    marker = staging / ".mtpchat" / "installed.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"repo_id": repo_id, "revision": "main", "files": files,
                                  "installed_at": 1.0, "summary": {"family": "qwen3_5"}}))
    os.replace(staging, root / name)


def _broken_repos(bases: dict[str, Path], where: Path) -> dict:
    from tests.fakehub import FakeRepo, _read_dir, tiny_repos

    repos = tiny_repos(where / "std")
    for name, edit in (("broken/shape", broken.wrong_shape), ("broken/heads", broken.set_text(
            num_attention_heads=0))):
        folder = make_variant(bases, where / name.replace("/", "-"), "tiny", edit)
        repos[name] = FakeRepo(_read_dir(folder))
    return repos


@pytest.fixture(scope="session")
def world(bases, tmp_path_factory):
    """Every case's folder, an app home with installed models, a fake Hub; yields the env."""
    from tests.fakehub import FakeHub, subprocess_env

    tmp = tmp_path_factory.mktemp("world")
    home = tmp / "home"
    root = home / "data" / "models"
    (root / ".partial").mkdir(parents=True)
    for name, repo_id in INSTALLED.items():
        _install(root, bases["tiny"], name, repo_id)
    folders = {c.id: make_variant(bases, tmp / c.id, c.base, c.edit) for c in CASES if c.base}
    with FakeHub(_broken_repos(bases, tmp / "repos")) as hub, \
            open(root / ".partial" / f"{RM_BUSY}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a download of RM_BUSY in progress
        yield {"env": subprocess_env(hub, home, PYTHONPATH=str(ROOT)), "folders": folders,
               "root": root, "tmp": tmp, "home": home}


def _limit_memory() -> None:
    # A regression that allocates 10 GB fails here instead of swapping the test machine.
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_batch(cases: list[dict], env: dict, timeout: float) -> dict[str, dict]:
    """Run ``cases`` in one child process; a hang or crash loses only the cases after it."""
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.reliability.cli_batch"], cwd=ROOT,
                              env=env, input=json.dumps(cases), capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_limit_memory)
        stdout, info = proc.stdout, {"rc": proc.returncode, "stderr": proc.stderr[-3000:]}
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        info = {"rc": "timeout", "stderr": f"no answer within {timeout} s"}
    results = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            results[r["id"]] = r
    results["__batch__"] = info
    return results


@pytest.fixture(scope="session")
def batch(world) -> dict[str, dict]:
    """Every case's result. RELIABILITY_ONE_PROCESS_PER_CASE=1 runs each case alone (slow;
    for measuring a checkout that hangs or crashes on some cases)."""
    cases = [{"id": c.id, "argv": c.argv(world["folders"].get(c.id), world["tmp"])}
             for c in CASES]
    if not os.environ.get("RELIABILITY_ONE_PROCESS_PER_CASE"):
        return run_batch(cases, world["env"], BATCH_TIMEOUT_S)
    results: dict[str, dict] = {}
    for case in cases:
        results.update(run_batch([case], world["env"], ONE_CASE_TIMEOUT_S))
    return results
