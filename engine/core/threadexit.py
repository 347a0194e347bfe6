"""The last call of every thread that ran MLX: ``release_thread_streams``.

MLX keeps some state per thread in C++ ``thread_local`` storage: the thread's streams and the
traces of its compiled functions (``mx.compile``), whose entries hold Python objects. C++ runs
those destructors after the thread's Python code has returned and let go of the interpreter;
dropping a Python object then takes the GIL back. When the main thread is already tearing the
interpreter down, taking the GIL ends the thread with a forced unwind through a ``noexcept``
destructor, and the C++ runtime aborts the whole process: "terminate called without an active
exception", exit status 134 (-6), after everything was written. It happened at the exit of a
server, a test run or a pull, now and then (9 of 10 runs of a script that decoded two greedy
streams on a thread and returned).

``mx.clear_streams()`` drops both (the compile cache with them) while the thread still holds
the GIL, so the C++ destructors find nothing left to do. MLX's own advice for threads."""
from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
_thread = threading.local()


def note_mlx_thread() -> None:
    """Where a thread starts MLX work (a model's load, a decoder): ``release_thread_streams``
    then waits for that work before dropping the thread's streams."""
    _thread.used = True


def release_thread_streams(*, synchronize: bool | None = None) -> None:
    """Call last in a thread that may have run MLX: its MLX work is finished (``synchronize``;
    by default where ``note_mlx_thread`` was called on it) and its per-thread state dropped
    while the interpreter is whole. A thread that never ran MLX is not made to: waiting would
    create its default stream, and MLX's ``import_function`` binds to the process's first
    stream, whichever thread owns it. Never raises (it runs in ``finally`` blocks, where it
    must not hide the thread's own outcome)."""
    mx = sys.modules.get("mlx.core")  # nothing to release where MLX was never imported
    if mx is None:
        return
    if synchronize is None:
        synchronize = getattr(_thread, "used", False)
    side = sys.modules.get("engine.decoding.side")  # its second stream, where one was made
    try:
        if side is not None:
            side.release()
        if synchronize:
            mx.synchronize()
        mx.clear_streams()
    except Exception:  # noqa: BLE001
        log.debug("could not release this thread's MLX state", exc_info=True)


def releasing(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` as a thread's target: ``release_thread_streams`` runs after it, however it ends."""
    @functools.wraps(fn)
    def run() -> None:
        try:
            fn()
        finally:
            release_thread_streams()
    return run
