"""Work around a reference-count bug in PySide6 6.12.0: ``SignalInstance.emit()`` returns
``True`` without taking a reference to it, so every emit from Python steals one reference of
``True``. On Python 3.11 (``True`` is not immortal) a few hundred emits later the interpreter
aborts with "Fatal Python error: bool_dealloc: deallocating True or False".

``install()`` measures one emit; only if it loses a reference does it wrap ``emit`` to give the
reference back. Idempotent; harmless on fixed PySide6 releases (nothing is patched there).
Importing any ``app`` Qt module installs it.
"""
from __future__ import annotations

import ctypes
import logging
import sys

from PySide6.QtCore import QObject, Signal, SignalInstance

log = logging.getLogger(__name__)

_installed = False


class _Probe(QObject):
    ping = Signal()


def emit_leaks_true() -> bool:
    """Whether one ``emit()`` drops a reference of the bool it returns (the 6.12.0 bug)."""
    probe = _Probe()
    before = (sys.getrefcount(True), sys.getrefcount(False))
    result = probe.ping.emit()
    del result
    after = (sys.getrefcount(True), sys.getrefcount(False))
    leaked = after[0] < before[0] or after[1] < before[1]
    if after[0] < before[0]:
        _give_back(True)  # repair the probe's own emit
    if after[1] < before[1]:
        _give_back(False)
    return leaked


def _give_back(obj: object) -> None:
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def install() -> bool:
    """Patch ``SignalInstance.emit`` if (and only if) it leaks; returns whether it patched."""
    global _installed
    if _installed or sys.version_info >= (3, 12):  # True is immortal from 3.12 on
        return False
    if not emit_leaks_true():
        _installed = True
        return False
    original = SignalInstance.emit

    def emit(self, *args):
        result = original(self, *args)
        if result is True or result is False:
            _give_back(result)
        return result

    SignalInstance.emit = emit
    _installed = True
    log.debug("patched SignalInstance.emit (PySide6 emit() reference leak)")
    return True


install()
