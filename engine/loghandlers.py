"""Log handlers that give up quietly: a full disk, a read-only log folder or a closed stderr
is reported once, in one line, and the handler then drops its records.

The standard handlers call ``handleError`` for every record that cannot be written, which
prints a ``--- Logging error ---`` traceback each time (hundreds of lines a minute on a full
disk). Only entry points (the app's ``app.logging_setup``, the CLI's ``engine.cli``) use these.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys


class _GiveUpOnError:
    """Mixin: the first failed ``emit`` says why on stderr (once); later records are dropped."""

    failed: BaseException | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is None:
            super().emit(record)  # type: ignore[misc]

    def handleError(self, record: logging.LogRecord) -> None:
        if self.failed is not None:
            return
        self.failed = sys.exc_info()[1] or RuntimeError("unknown error")
        if isinstance(self.failed, OSError):
            _quiet_std_stream(getattr(self, "stream", None))
        where = getattr(self, "baseFilename", None) or "stderr"
        line = (f"logging to {where} failed ({self.failed}); later log records are not "
                "written there\n")
        for stream in (sys.stderr, sys.__stderr__):
            if stream is None or stream is getattr(self, "stream", None):
                continue
            try:
                stream.write(line)
                stream.flush()
                return
            except (OSError, ValueError):
                continue


def _quiet_std_stream(stream) -> None:
    """Point a failing stdout or stderr at /dev/null. A buffered standard stream keeps the line
    it could not write, and the interpreter's last flush at exit then fails as well: the
    process ended with status 120 instead of its own (``engine info 2>/dev/full`` without
    ``PYTHONUNBUFFERED``). Other streams are left alone."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    if fd not in (1, 2):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class QuietStreamHandler(_GiveUpOnError, logging.StreamHandler):
    pass


class QuietRotatingFileHandler(_GiveUpOnError, logging.handlers.RotatingFileHandler):
    pass
