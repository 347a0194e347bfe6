"""The ``QApplication`` every entry point makes (the app, the self-test, the dashboard demo,
the benches), named "MTP Chat" everywhere the desktop shows it."""
from __future__ import annotations

from app import __version__

APP_NAME = "MTP Chat"
APP_ID = "mtpchat"  # the desktop file's name, X11's WM_CLASS instance, the command


def application():
    """The ``QApplication``, named "MTP Chat" everywhere the desktop shows it (not
    ``__main__.py``): the application and display name, the desktop file name (Wayland's app
    id) and, on X11, the WM_CLASS ("mtpchat", "MTP Chat"; Qt takes the instance part from
    argv[0], so argv[0] is the command's name rather than the script's)."""
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication

    QGuiApplication.setApplicationName(APP_NAME)
    QGuiApplication.setApplicationDisplayName(APP_NAME)
    QGuiApplication.setApplicationVersion(__version__)
    QGuiApplication.setDesktopFileName(APP_ID)
    return QApplication.instance() or QApplication([APP_ID])
