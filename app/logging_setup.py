"""Logging for the app: a rotating file under the log dir, stderr, and Qt's own messages.
A handler that cannot write (a full disk) says so once and stops (``engine.loghandlers``)."""
from __future__ import annotations

import logging
import sys

from app.paths import log_file
from engine.loghandlers import QuietRotatingFileHandler, QuietStreamHandler

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
qt_log = logging.getLogger("qt")
# Messages the offscreen/minimal platform plugins print for every window; not problems.
_BENIGN = ("This plugin does not support propagateSizeHints",
           "This plugin does not support raise", "This plugin does not support grabbing")


def setup_logging(level: int = logging.INFO) -> None:
    root = logging.getLogger()
    if getattr(root, "_mtpchat_configured", False):
        return
    root.setLevel(logging.DEBUG)
    sh = QuietStreamHandler(sys.stderr)
    sh.setLevel(level)
    sh.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(sh)
    try:
        fh = QuietRotatingFileHandler(
            log_file(), maxBytes=2_000_000, backupCount=3, encoding="utf-8")
    except OSError as exc:  # read-only or full location: stderr only, and say so once
        logging.getLogger(__name__).warning("cannot write the log file (%s); logging to stderr only", exc)
    else:
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(fh)
    root._mtpchat_configured = True  # type: ignore[attr-defined]


def install_qt_message_handler() -> None:
    """Route qDebug/qWarning/... into Python logging."""
    from PySide6.QtCore import QtMsgType, qInstallMessageHandler

    levels = {
        QtMsgType.QtDebugMsg: logging.DEBUG,
        QtMsgType.QtInfoMsg: logging.INFO,
        QtMsgType.QtWarningMsg: logging.WARNING,
        QtMsgType.QtCriticalMsg: logging.ERROR,
        QtMsgType.QtFatalMsg: logging.CRITICAL,
    }

    def handler(mode, context, message):  # noqa: ANN001
        level = levels.get(mode, logging.WARNING)
        if any(s in message for s in _BENIGN):
            level = logging.DEBUG
        qt_log.log(level, "%s", message)

    qInstallMessageHandler(handler)
