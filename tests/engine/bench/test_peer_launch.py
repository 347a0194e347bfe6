"""Peers run on the same BLAS as this engine: a bare ``python -m mlx_lm.server`` on Linux
multiplies with MLX's reference BLAS (several times slower), which once inflated the agent
session's ratios (``engine.bench.agent_session.peer_command``)."""
import subprocess
import sys

import pytest

from engine import _blas
from engine.bench.agent_session import ROOT, peer_command

PROBE = '''import sys
import mlx.core  # noqa: F401  (after the launcher's BLAS, as a peer imports it)
maps = open("/proc/self/maps").read()
print("openblas" in maps, sys.argv[1:])
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_peer_module_runs_with_its_arguments_on_this_engines_blas(tmp_path):
    if _blas.ensure_fast_blas() != "openblas":
        pytest.skip("no OpenBLAS on this machine")
    (tmp_path / "peer_probe.py").write_text(PROBE, encoding="utf-8")
    out = subprocess.run(peer_command("peer_probe", "--port", "1"), capture_output=True,
                         text=True, timeout=120, cwd=ROOT,
                         env={"PYTHONPATH": f"{ROOT}:{tmp_path}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "['--port',", "'1']"]
    bare = subprocess.run([sys.executable, "-c", PROBE, "x"], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert bare.stdout.startswith("False"), "the probe cannot tell the two apart"
