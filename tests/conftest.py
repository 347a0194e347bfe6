"""Test-wide configuration: offscreen Qt, an isolated app home, no network."""
from __future__ import annotations

import os
import tempfile

# Set before anything imports Qt, huggingface_hub or transformers.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["HF_HUB_OFFLINE"] = os.environ.get("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-test-home-"))
# No background warm-up of loaded models (engine/core/warmup.py) in tests that do not test it:
# it would add decoders and CPU load behind every scheduler and server; its own tests turn it on.
os.environ.setdefault("MTP_WARMUP", "0")

import engine  # noqa: E402,F401  - loads OpenBLAS before any test module imports mlx


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def repos(tmp_path_factory):
    """The fake Hub's tiny model repos (tests/fakehub.py), built once."""
    from tests.fakehub import tiny_repos

    return tiny_repos(tmp_path_factory.mktemp("repos"))


@pytest.fixture
def fake(repos, monkeypatch, tmp_path):
    """A running fake Hub, huggingface_hub pointed at it, no token anywhere, a fresh home."""
    from tests.fakehub import FakeHub, point_hf_at

    with FakeHub(repos) as h:
        point_hf_at(h, monkeypatch, tmp_path)
        yield h
