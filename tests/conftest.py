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

import engine  # noqa: E402,F401  - loads OpenBLAS before any test module imports mlx
