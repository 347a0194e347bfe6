"""Cases that need a process of their own: a FIFO or /dev/zero as config.json (a hang or a
memory blow-up would take a shared batch down), bytes that are not UTF-8 on the command line,
and the real ``python -m engine`` entry point's exit status."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability import broken
from tests.reliability.conftest import ROOT, make_variant

TIMEOUT_S = 60


def _engine(*args, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MTPCHAT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env,
                          capture_output=True, timeout=TIMEOUT_S)


def _assert_clean(out: subprocess.CompletedProcess, rc: int, *words: str) -> str:
    text = (out.stderr + out.stdout).decode("utf-8", "replace")
    assert "Traceback" not in text, text
    assert out.returncode == rc, f"exit {out.returncode}:\n{text}"
    for w in words:
        assert w.lower() in text.lower(), f"{w!r} not in {text}"
    return text


def _fifo(folder: Path) -> None:
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")


def _dev_zero(folder: Path) -> None:
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to("/dev/zero")


def _sparse_huge(folder: Path) -> None:
    with open(folder / "config.json", "r+b") as fh:
        fh.truncate(70 * 2**20)


@pytest.mark.parametrize("verb", ["inspect", "generate"])
@pytest.mark.parametrize("edit,words", [
    (_fifo, ("config.json", "not a regular file")),
    (_dev_zero, ("config.json", "not a regular file")),
    (_sparse_huge, ("config.json", "implausibly large")),
], ids=["fifo", "dev-zero", "70MB"])
def test_config_json_that_is_not_a_small_regular_file(bases, tmp_path, verb, edit, words):
    folder = make_variant(bases, tmp_path, "tiny", edit)
    args = ["inspect", str(folder)] if verb == "inspect" else \
        ["generate", "--model", str(folder), "--prompt-ids", "1", "--max-tokens", "1"]
    _assert_clean(_engine(*args, home=tmp_path / "home"), 2, *words)


def test_tokenizer_json_fifo(bases, tmp_path):
    def fifo(folder: Path) -> None:
        (folder / "tokenizer.json").unlink()
        os.mkfifo(folder / "tokenizer.json")

    folder = make_variant(bases, tmp_path, "tiny", fifo)
    out = _engine("generate", "--model", str(folder), "--prompt-ids", "1", "--max-tokens", "1",
                  home=tmp_path / "home")
    _assert_clean(out, 2, "tokenizer.json", "not a regular file")


def test_invalid_utf8_argument(tmp_path):
    out = _engine(os.fsdecode(b"generate"), "--prompt", os.fsdecode(b"caf\xe9 \xff"),
                  "--max-tokens", "1", home=tmp_path / "home")
    _assert_clean(out, 2, "not valid UTF-8")


def test_entry_point_exit_status_for_a_broken_model(bases, tmp_path):
    folder = make_variant(bases, tmp_path, "tiny", broken.set_text(num_attention_heads=0))
    out = _engine("generate", "--model", str(folder), "--prompt-ids", "1", "--max-tokens", "1",
                  home=tmp_path / "home")
    text = _assert_clean(out, 2, "num_attention_heads")
    assert text.count("error:") == 1
