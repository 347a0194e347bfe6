"""Where the engine finds the embedded demo model (a checkout, an install, or a frozen app)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

DEMO_MODEL_NAME = "mtp-demo-qwen3_5"


def resources_dir() -> Path:
    """The ``resources/`` folder: $MTPCHAT_RESOURCES, a PyInstaller bundle, or the source tree."""
    env = os.environ.get("MTPCHAT_RESOURCES")
    if env:
        return Path(env)
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        return Path(frozen_root) / "resources"
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "resources", here / "_resources"):
        if candidate.is_dir():
            return candidate
    return here.parent / "resources"


def default_model_path() -> Path:
    return resources_dir() / "models" / DEMO_MODEL_NAME
