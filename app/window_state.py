"""Window sizes: every window opens within the screen's available area (a 1280×800 screen
included) and comes back at the size and place it was left.

Geometry is kept in the chat database's app settings (``geometry.<name>``, base64 of Qt's
``saveGeometry()``), read back with ``restore_geometry``; a saved place that is off every
screen now (a monitor unplugged) is pulled back into the available area.
"""
from __future__ import annotations

import logging
from typing import Protocol

from PySide6.QtCore import QByteArray, QRect
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

log = logging.getLogger(__name__)
MARGIN = 16  # left free around a window made to fit the screen


class SettingsStore(Protocol):
    def get_setting(self, key: str, default=None): ...

    def set_setting(self, key: str, value) -> None: ...


def available_area(w: QWidget) -> QRect:
    screen = w.screen() or QGuiApplication.primaryScreen()
    return screen.availableGeometry() if screen is not None else QRect(0, 0, 1280, 800)


def fit_to_screen(w: QWidget, size: tuple[int, int]) -> None:
    """Resize ``w`` to ``size``, or less where the screen's available area is smaller."""
    area = available_area(w)
    width = max(min(size[0], area.width() - MARGIN), min(w.minimumWidth(), area.width()))
    height = max(min(size[1], area.height() - MARGIN), min(w.minimumHeight(), area.height()))
    w.resize(width, height)


def keep_on_screen(w: QWidget) -> None:
    """Shrink and move ``w`` (frame included) into the available area when it is outside."""
    area = available_area(w)
    frame = w.frameGeometry()
    extra_w, extra_h = frame.width() - w.width(), frame.height() - w.height()
    width = min(w.width(), area.width() - extra_w)
    height = min(w.height(), area.height() - extra_h)
    if (width, height) != (w.width(), w.height()):
        w.resize(max(width, 100), max(height, 100))
        frame = w.frameGeometry()
    x = min(max(frame.x(), area.left()), area.right() - frame.width() + 1)
    y = min(max(frame.y(), area.top()), area.bottom() - frame.height() + 1)
    if (x, y) != (frame.x(), frame.y()):
        w.move(x, y)


def save_geometry(store: SettingsStore, name: str, w: QWidget) -> None:
    try:
        store.set_setting(f"geometry.{name}", bytes(w.saveGeometry().toBase64()).decode("ascii"))
    except Exception:  # noqa: BLE001 - a full disk must not stop the app from closing
        log.warning("could not save the %s window's geometry", name, exc_info=True)


def restore_geometry(store: SettingsStore, name: str, w: QWidget) -> bool:
    """Put ``w`` where it was left; False when nothing usable was saved."""
    saved = store.get_setting(f"geometry.{name}")
    if not isinstance(saved, str) or not saved:
        return False
    if not saved.isascii() or not w.restoreGeometry(QByteArray.fromBase64(saved.encode("ascii"))):
        return False
    keep_on_screen(w)
    return True
