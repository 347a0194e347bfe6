"""What a cluster refuses, each in one line: a wrong or unreadable hostfile, a family that
cannot be split, and model folders that differ between ranks (checked by every rank before
any weight is read)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.distributed.family import fingerprint, sharder
from engine.distributed.launch import launch_command, read_hostfile
from engine.errors import ClusterError, UnsupportedModelError
from tests.engine.distributed.cluster import ROOT, env, free_ports, write_hostfile
from tests.tinymodels import build_tiny_model


def _one_line_error(args, tmp_path) -> str:
    r = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("content, says", [
    (None, "cannot read the hostfile"),
    ("{not json", "is not JSON"),
    (json.dumps({"hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}]}), "at least two"),
    (json.dumps({"hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ips": ["10.0.0.2"]}]}),
     "no \"ssh\" name"),
    (json.dumps({"hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["b"]}]}),
     "is not an IP address"),
    (json.dumps({"backend": "smoke", "hosts": [{"ssh": "a"}, {"ssh": "b"}]}),
     "names backend"),
])
def test_a_bad_hostfile_is_one_line(tmp_path, content, says):
    path = tmp_path / "hosts.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ClusterError, match=says):
        read_hostfile(path)


def test_the_cli_says_it_in_one_line(tmp_path):
    (tmp_path / "hosts.json").write_text("[1, 2")
    line = _one_line_error(["serve", "--hostfile", str(tmp_path / "hosts.json")], tmp_path)
    assert "is not JSON" in line
    line = _one_line_error(["generate", "--prompt", "hi", "--hostfile",
                            str(tmp_path / "none.json")], tmp_path)
    assert "cannot read the hostfile" in line


def test_the_ring_backend_needs_ips(tmp_path):
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"hosts": [{"ssh": "a"}, {"ssh": "b"}]}))
    with pytest.raises(ClusterError, match="needs \"ips\""):
        launch_command(["serve"], str(path), backend="ring")
    cmd = launch_command(["serve", "--port", "9"], str(write_hostfile(tmp_path)),
                         backend=None, port=40000)
    assert cmd[-5:] == ["-m", "engine", "serve", "--port", "9"]
    assert ["--backend", "ring"] == cmd[cmd.index("--backend"):cmd.index("--backend") + 2]


def test_an_unsupported_family_is_one_line():
    with pytest.raises(UnsupportedModelError, match="cannot be split across machines"):
        sharder("llama")


def test_tensor_parallel_needs_divisible_sizes():
    class Group:
        def size(self):
            return 3
    with pytest.raises(UnsupportedModelError, match="divisible by 3"):
        sharder("qwen3_5")(None, Group(), "tensor", {"num_attention_heads": 4})


def test_the_fingerprint_sees_other_weights_of_the_same_shapes(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=1)
    b = build_tiny_model(tmp_path / "b", seed=2)
    c = build_tiny_model(tmp_path / "c", seed=1)

    def fp(d):
        return fingerprint(d, sorted(d.glob("*.safetensors")))
    assert fp(a) == fp(c) != fp(b)


SCRIPT = """
import sys, types
from engine.distributed import node
from engine.errors import ClusterError
args = types.SimpleNamespace(split="tensor", step_timeout=30, backend=None, model=None,
                             dtype=None)
cluster = node.join(args)
args.model = sys.argv[1 + cluster.rank]
try:
    node.load_shard(cluster, args)
    print(f"LOADED {cluster.rank}", flush=True)
except ClusterError as exc:
    print(f"REFUSED {cluster.rank}: {exc}", flush=True)
"""


@pytest.mark.timeout(300)
def test_different_model_folders_are_refused_before_loading(tmp_path):
    """Each rank gets its own folder (same shapes, other weights): both refuse, in one line,
    before reading a weight."""
    from engine.distributed.launch import launcher

    a = build_tiny_model(tmp_path / "a", seed=1)
    b = build_tiny_model(tmp_path / "b", seed=2)
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    cmd = [*launcher(), "--hostfile", str(write_hostfile(tmp_path)), "--backend", "ring",
           "--starting-port", str(free_ports(2)), "--python", sys.executable, "--cwd",
           str(ROOT), str(script), str(a), str(b)]
    r = subprocess.run(cmd, env=env(tmp_path), capture_output=True, text=True, timeout=240)
    out = r.stdout
    assert "LOADED" not in out, out + r.stderr
    for rank in (0, 1):
        line = next(x for x in out.splitlines() if x.startswith(f"REFUSED {rank}:"))
        assert "differs between ranks (rank 1 against rank 0" in line
