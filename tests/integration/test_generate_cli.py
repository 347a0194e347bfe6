"""`python -m engine generate --chat` on the embedded demo model, as a user runs it."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generate(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine", "generate", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


def test_chat_answer_is_clean_and_right():
    out = _generate("--prompt", "What does `os.path.join` do?", "--chat", "--max-tokens", "96")
    assert out.returncode == 0, out.stderr
    assert "<think>" not in out.stdout  # the empty thinking-off block is not shown
    assert out.stdout.startswith("`os.path.join(a, *p)`")
    assert "Join two or more pathname components" in out.stdout
    assert "tokens/cycle" in out.stderr


def test_default_depth_speculates():
    out = _generate("--prompt", "How do I use itertools.chain?", "--chat", "--max-tokens", "64",
                    "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["stats"]["speculative_cycles"] > 0 and res["stats"]["accepted"] > 0
    assert "itertools.chain" in res["text"]
