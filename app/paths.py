"""Every location the app reads or writes. Nothing is ever written inside the bundle.

``data_dir`` is ``engine.paths.data_dir`` ($MTPCHAT_HOME overrides every location: tests,
portable installs); config and logs have their own folders here.
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from engine.paths import APP_NAME, data_dir, store_root
from engine.resources import default_model_path, resources_dir

APP_AUTHOR = APP_NAME

__all__ = ["resources_dir", "default_model_path", "data_dir", "log_dir", "config_dir",
           "models_dir", "db_path", "log_file"]


def _dirs() -> platformdirs.PlatformDirs:
    return platformdirs.PlatformDirs(APP_NAME, APP_AUTHOR)


def config_dir() -> Path:
    home = os.environ.get("MTPCHAT_HOME")
    p = Path(home) / "config" if home else Path(_dirs().user_config_dir)
    p.mkdir(parents=True, exist_ok=True)
    return p


def log_dir() -> Path:
    home = os.environ.get("MTPCHAT_HOME")
    p = Path(home) / "logs" if home else Path(_dirs().user_log_dir)
    p.mkdir(parents=True, exist_ok=True)
    return p


def log_file() -> Path:
    return log_dir() / "mtpchat.log"


def models_dir() -> Path:
    """The model store's folder (the user's chosen one, else ``<data dir>/models``)."""
    p = store_root()
    p.mkdir(parents=True, exist_ok=True)
    return p


def db_path() -> Path:
    return data_dir() / "chats.sqlite3"
