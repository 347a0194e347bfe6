"""Guard against a reference-count bug of PySide6 6.12.0 on Python 3.11.

Measured here: with PySide6 6.12.0 every wrapped method that returns nothing hands back
``None`` without taking a reference (``QLabel.setText``, ``QTimer.start``, ``processEvents``...)
and ``SignalInstance.emit()`` does the same with ``True``. Python 3.12+ does not care (those
objects are immortal there) but on 3.11 each call steals one reference, and a few thousand calls
later the interpreter aborts with "Fatal Python error: none_dealloc" (or ``bool_dealloc``).
PySide6 6.11.3 does not have the bug — pinning ``pyside6<6.12`` is the real fix.

``install()`` measures one such call; only if references leak does it give ``None``, ``True``
and ``False`` a reference count so large that no realistic number of calls can exhaust it (what
CPython 3.12 does for immortal objects). It is idempotent and a no-op on unaffected versions.
Importing any ``app`` Qt module installs it.
"""
from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

_RESERVE = 1 << 40  # references added to each singleton; ~10^12 leaked calls to run out
_state = {"checked": False, "patched": False}


def leaks_singleton_refs() -> bool:
    """Whether PySide6 calls drop references of ``None`` / ``True`` (the 6.12.0 bug)."""
    from PySide6.QtCore import QObject, QTimer, Signal

    class _Probe(QObject):
        ping = Signal()

    probe, timer = _Probe(), QTimer()
    n0, t0 = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(8):
        timer.setInterval(1000)
        probe.ping.emit()
    lost_none = n0 - sys.getrefcount(None)
    lost_true = t0 - sys.getrefcount(True)
    return lost_none >= 8 or lost_true >= 8


def _add_references(obj: object, n: int) -> None:
    # ob_refcnt is the first Py_ssize_t of every object in release builds of CPython 3.11.
    cell = ctypes.c_ssize_t.from_address(id(obj))
    cell.value += n


def install() -> bool:
    """Apply the guard if this PySide6 leaks; returns whether it did."""
    if _state["checked"]:
        return _state["patched"]
    _state["checked"] = True
    if sys.version_info >= (3, 12) or hasattr(sys, "gettotalrefcount"):
        return False  # immortal singletons (3.12+), or a debug build with another layout
    if not leaks_singleton_refs():
        return False
    for obj in (None, True, False):
        _add_references(obj, _RESERVE)
    _state["patched"] = True
    import PySide6

    log.info("PySide6 %s leaks references of None/True on Python %d.%d; guarded "
                "(pin pyside6<6.12 to avoid it)", PySide6.__version__, *sys.version_info[:2])
    return True


install()
