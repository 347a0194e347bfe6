"""Every location the app reads or writes. Nothing is ever written inside the bundle.

Every folder is ``engine.paths.app_dir`` ($MTPCHAT_HOME overrides every location: tests,
portable installs); this module names the app's own files in them.
"""
from __future__ import annotations

from pathlib import Path

from engine.paths import app_dir, data_dir, store_root
from engine.resources import default_model_path, resources_dir

__all__ = ["resources_dir", "default_model_path", "data_dir", "log_dir", "config_dir",
           "models_dir", "db_path", "log_file"]


def config_dir(*, create: bool = True) -> Path:
    return app_dir("config", create=create)


def log_dir(*, create: bool = True) -> Path:
    return app_dir("log", create=create)


def log_file() -> Path:
    return log_dir() / "mtpchat.log"


def models_dir() -> Path:
    """The model store's folder (the user's chosen one, else ``<data dir>/models``)."""
    p = store_root()
    p.mkdir(parents=True, exist_ok=True)
    return p


def db_path() -> Path:
    return data_dir() / "chats.sqlite3"
