"""``python -m engine pull`` as a real subprocess against the fake Hub: kill, resume, load."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.fakehub import FakeHub, subprocess_env, tiny_repos

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return tiny_repos(tmp_path_factory.mktemp("repos"))


def _engine(*args, env, timeout=120, check=True):
    out = subprocess.run([sys.executable, "-m", "engine", *args], env=env, capture_output=True,
                         text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


def _wait_for(pred, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def test_pull_killed_mid_file_resumes_without_refetching_then_loads(repos, tmp_path):
    sizes = {p: len(b) for p, b in repos["tiny/mtp"].files.items()}
    models = tmp_path / "models"
    part = models / ".partial" / "tiny--mtp" / (SHARD1 + ".part")
    with FakeHub(repos) as fake:
        env = subprocess_env(fake, tmp_path / "home")
        fake.chunk_size = 8192
        fake.path_delay_s[SHARD1] = 0.02
        cmd = [sys.executable, "-m", "engine", "pull", "tiny/mtp", "--json",
               "--models-dir", str(models)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _wait_for(lambda: part.exists() and part.stat().st_size >= 150_000)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        fake.wait_idle()
        run1 = fake.served_for("tiny/mtp")
        kept = part.stat().st_size
        assert kept < sizes[SHARD1] and proc.returncode == -signal.SIGKILL

        fake.reset_counts()
        fake.path_delay_s.clear()
        out = _engine("pull", "tiny/mtp", "--json", "--models-dir", str(models), env=env)
        run2 = fake.served_for("tiny/mtp")
        ranges = [r["range"] for r in fake.requests if r["path"].endswith(SHARD1)]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nkill/resume byte counts: run1 served {run1}; part kept {kept}; "
          f"run2 served {run2}; sizes {sizes}")
    assert result["event"] == "result" and result["status"] == "installed"
    assert result["resumed_bytes"] >= kept
    assert ranges == [f"bytes={kept}-"]
    assert run2[SHARD1] == sizes[SHARD1] - kept  # the finished part was not fetched again
    assert run2[SHARD2] == sizes[SHARD2]
    assert all(run2.get(p, 0) == 0 for p in sizes if not p.endswith(".safetensors"))
    assert all(run1[p] == sizes[p] for p in sizes if not p.endswith(".safetensors"))

    import engine

    model = engine.load(result["path"])
    assert model.info.has_mtp
    ids = model.chat_ids([{"role": "user", "content": "hello"}])
    events = list(model.generate(ids, max_tokens=8, depth=2))
    assert sum(len(e.token_ids) for e in events) == 8 or events[-1].finish_reason == "stop"
    assert events[-1].finish_reason in ("stop", "length")


def test_cli_list_inspect_rm_catalog(repos, tmp_path):
    models = tmp_path / "models"
    with FakeHub(repos) as fake:
        env = subprocess_env(fake, tmp_path / "home")
        _engine("pull", "tiny/no-mtp", "--models-dir", str(models), env=env)
        rows = json.loads(_engine("list", "--json", "--models-dir", str(models), env=env).stdout)
        by_name = {r["name"]: r for r in rows}
        assert by_name["tiny--no-mtp"]["status"] == "installed"
        assert by_name["tiny--no-mtp"]["has_mtp"] is False
        assert any(r["status"] == "builtin" and not r["deletable"] for r in rows)

        r = json.loads(_engine("inspect", "tiny/no-mtp", "--json", env=env).stdout)
        assert r["supported"] and not r["has_mtp"] and "--convert --bits 4" in r["fix"]
        local = json.loads(_engine("inspect", str(models / "tiny--no-mtp"), "--json",
                                   env=env).stdout)
        assert local["parameters"] == r["parameters"]
        bad = _engine("inspect", "tiny/llama", "--json", env=env, check=False)
        assert bad.returncode == 1 and not json.loads(bad.stdout)["supported"]
        gated = _engine("pull", "tiny/gated", "--models-dir", str(models), env=env, check=False)
        assert gated.returncode == 2 and "hf auth login" in gated.stderr

    refused = _engine("rm", "tiny--no-mtp", "--models-dir", str(models), env=env, check=False)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    _engine("rm", "tiny--no-mtp", "--yes", "--models-dir", str(models), env=env)
    assert not (models / "tiny--no-mtp").exists()
    cat = json.loads(_engine("catalog", "--json", "--models-dir", str(models), env=env).stdout)
    assert {m["verdict"] for m in cat["models"]} <= {
        "recommended", "tight fit", "too slow", "not enough memory", "not enough disk"}


def test_pull_convert(repos, tmp_path):
    models = tmp_path / "models"
    with FakeHub(repos) as fake:
        env = subprocess_env(fake, tmp_path / "home")
        out = _engine("pull", "tiny/mtp", "--convert", "--bits", "8", "--json",
                      "--models-dir", str(models), env=env, check=False, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["converted"] and result["name"] == "tiny--mtp-mlx-8bit"
    info = json.loads(_engine("inspect", result["path"], "--json", env=env).stdout)
    assert info["has_mtp"] and info["quantization"]["bits"] == 8 and info["layout"] == "mlx"


def test_pull_convert_killed_mid_way_resumes_without_redoing_shards(tmp_path):
    from tests.fakehub import FakeRepo, _read_dir
    from tests.tinymodels import build_tiny_model

    src = build_tiny_model(tmp_path / "src", seed=5, shards=4, hidden=128, layers=8)
    models = tmp_path / "models"
    state = models / ".partial" / "org--big-mlx-4bit" / ".mtpchat" / "stream_convert.json"
    with FakeHub({"org/big": FakeRepo(_read_dir(src))}) as fake:
        env = subprocess_env(fake, tmp_path / "home")
        fake.chunk_size, fake.chunk_delay_s = 16384, 0.01
        cmd = [sys.executable, "-m", "engine", "pull", "org/big", "--convert", "--bits", "4",
               "--group-size", "32", "--json", "--models-dir", str(models)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _wait_for(lambda: state.exists() and "model-00002" in state.read_text(), 120)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        fake.wait_idle()
        done = json.loads(state.read_text())["done"]
        assert proc.returncode == -signal.SIGKILL and len(done) in (2, 3)
        fake.chunk_delay_s = 0
        fake.reset_counts()
        out = _engine("pull", "org/big", "--convert", "--bits", "4", "--group-size", "32",
                      "--json", "--models-dir", str(models), env=env, timeout=300)
        served = fake.served_for("org/big")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "installed" and result["converted"]
    assert not any(p in served for p in done)  # finished shards: neither fetched nor redone
    assert served.get("model-00004-of-00004.safetensors")
    info = json.loads(_engine("inspect", result["path"], "--json", env=env).stdout)
    assert info["has_mtp"] and info["quantization"]["bits"] == 4 and info["supported"]


def test_pulling_an_installed_unchanged_model_again_downloads_nothing(repos, tmp_path):
    from tests.fakehub import FakeRepo

    repo = FakeRepo(dict(repos["tiny/no-mtp"].files))
    models = tmp_path / "models"
    with FakeHub({"tiny/no-mtp": repo}) as fake:
        env = subprocess_env(fake, tmp_path / "home")
        first = _engine("pull", "tiny/no-mtp", "--models-dir", str(models), env=env)
        assert "installed tiny--no-mtp" in first.stdout
        marker = (models / "tiny--no-mtp" / ".mtpchat" / "installed.json").read_bytes()

        fake.reset_counts()
        again = _engine("pull", "tiny/no-mtp", "--models-dir", str(models), env=env)
        assert "already installed (up to date)" in again.stdout, again.stdout
        assert sum(fake.served_for("tiny/no-mtp").values()) == 0
        assert (models / "tiny--no-mtp" / ".mtpchat" / "installed.json").read_bytes() == marker
        as_json = _engine("pull", "tiny/no-mtp", "--json", "--models-dir", str(models), env=env)
        result = json.loads(as_json.stdout.strip().splitlines()[-1])
        assert result["up_to_date"] and result["status"] == "installed"
        assert result["bytes_fetched"] == 0

        (models / "tiny--no-mtp" / "config.json").unlink()  # damaged locally: fetched again
        fake.reset_counts()
        _engine("pull", "tiny/no-mtp", "--models-dir", str(models), env=env)
        assert sum(fake.served_for("tiny/no-mtp").values()) > 0

        repo.files["tokenizer_config.json"] = repo.files["tokenizer_config.json"] + b" "
        fake.reset_counts()  # a new revision on the Hub: fetched again
        out = _engine("pull", "tiny/no-mtp", "--models-dir", str(models), env=env)
        assert "already installed" not in out.stdout
        assert fake.served_for("tiny/no-mtp").get("tokenizer_config.json")


def test_pull_convert_again_is_a_no_op_too(repos, tmp_path):
    models = tmp_path / "models"
    with FakeHub(repos) as fake:
        env = subprocess_env(fake, tmp_path / "home")
        args = ("pull", "tiny/mtp", "--convert", "--bits", "8", "--models-dir", str(models))
        _engine(*args, env=env, timeout=300)
        fake.reset_counts()
        again = _engine(*args, env=env, timeout=300)
    assert "already installed (up to date)" in again.stdout, again.stdout
    assert sum(fake.served_for("tiny/mtp").values()) == 0


@pytest.mark.slow
def test_pull_convert_never_aborts_at_exit(repos, tmp_path):
    """MLX ran on the pull thread; its thread-local streams, left to their destructors, now and
    then aborted the process after "installed" (exit -6, "terminate called without an active
    exception": 3 of 30 runs before the fix, 0 of 30 after)."""
    with FakeHub(repos) as fake:
        codes = []
        for i in range(12):
            env = subprocess_env(fake, tmp_path / f"home{i}")
            out = _engine("pull", "tiny/mtp", "--convert", "--bits", "8", "--models-dir",
                          str(tmp_path / f"models{i}"), env=env, timeout=300, check=False)
            codes.append(out.returncode)
            assert "terminate called" not in out.stderr, out.stderr
    assert codes == [0] * len(codes)
