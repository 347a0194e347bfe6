"""One MTP Chat per data folder.

Two apps on one chat database would step on each other (the second one tidies away the first
one's open empty chat, and its next send then fails). The first start holds an advisory lock
on ``<data dir>/mtpchat.lock``; a second start on the same folder is told so and exits. The
operating system drops the lock when the process ends, however it ends (kill -9 included).
"""
from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path


class AlreadyRunningError(RuntimeError):
    """Another MTP Chat holds this data folder."""


@dataclass
class InstanceLock:
    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def acquire(folder: Path) -> InstanceLock:
    """Lock ``folder`` for this process; raises ``AlreadyRunningError`` if another holds it
    and ``OSError`` if the lock file cannot be made (a read-only folder: then run unlocked)."""
    path = Path(folder) / "mtpchat.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunningError(
            f"MTP Chat is already running with the data folder {folder}. Switch to that "
            "window, or set MTPCHAT_HOME to use another folder.") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return InstanceLock(path, fd)
