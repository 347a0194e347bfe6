"""MTP Chat's desktop app (PySide6). Imports ``engine``; the engine never imports the app."""
from __future__ import annotations

from engine import __version__

__all__ = ["__version__"]
