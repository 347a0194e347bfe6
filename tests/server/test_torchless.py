"""An installed torch (the test and train extras install it) stays out of the processes that
run MLX only: transformers would import it while loading the tokenizer, costing seconds of
start-up and gigabytes of address space in every server and app process."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.server.conftest import ROOT

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed"),
    pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps"),
]


def _torch_mapped(pid: int) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return sorted({line.split()[-1] for line in maps.splitlines() if "/torch/" in line})


def _python(code: str) -> list[str]:
    """What a fresh interpreter running ``code`` in the checkout prints, split on whitespace."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_served_model_never_maps_torch(shared_demo_server):
    body = json.dumps({"model": shared_demo_server.model, "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "user", "content": "What does os.path.join do?"}]})
    req = urllib.request.Request(shared_demo_server.url + "/v1/chat/completions",
                                 data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert json.load(resp)["choices"][0]["message"]["content"]
    assert _torch_mapped(shared_demo_server.proc.pid) == []


def test_engine_entry_keeps_torch_out_but_training_may_use_it():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "engine", "generate", "--chat",
                          "--max-tokens", "4", "--depth", "2", "--prompt", "What is os.sep?"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert "transformers.configuration_utils" in imported  # the path that would import torch
    assert "torch" not in imported
    from engine import cli

    assert "train-demo" in cli._TORCH_VERBS


def test_app_entry_keeps_torch_out():
    code = ("import sys\nimport app.main as m\nm.main = lambda: 0\nm.run()\n"
            "from engine.models import model\nimport engine\n"
            "model.load(engine.default_model_path())\nprint('torch' in sys.modules)\n")
    assert _python(code)[-1] == "False"


def test_too_late_once_torch_is_imported():
    code = ("import torch, sys\nfrom engine.torchless import keep_torch_out\n"
            "print(keep_torch_out())\nimport transformers.utils.import_utils as iu\n"
            "print(iu.is_torch_available())\n")
    assert _python(code) == ["False", "True"]
