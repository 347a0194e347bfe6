"""Entry script of the frozen app (PyInstaller): prepare the process, then run app.main.main().

Kept tiny on purpose; everything the app does lives in ``app``. Frozen-only duties:
- drop the ``-psn_…`` argument macOS may add when Finder launches an app,
- make child processes work (``multiprocessing.freeze_support``),
- point OpenSSL at certifi's CA bundle (a frozen Python has no system CA path of its own),
- record hard crashes (segfaults, Metal aborts) in ``crash.log`` in the app's log folder.
"""
from __future__ import annotations

import multiprocessing
import os
import sys


def _prepare_frozen() -> None:
    if not getattr(sys, "frozen", False):
        return
    if "SSL_CERT_FILE" not in os.environ:
        try:
            import certifi

            os.environ["SSL_CERT_FILE"] = certifi.where()
        except ImportError:
            pass
    try:
        import faulthandler

        from app.paths import log_dir

        crash_log = open(log_dir() / "crash.log", "a", encoding="utf-8")  # noqa: SIM115 - lives for the process
        faulthandler.enable(file=crash_log, all_threads=True)
    except OSError:
        pass


def run() -> int:
    multiprocessing.freeze_support()
    _prepare_frozen()
    from app.main import main

    return main([a for a in sys.argv[1:] if not a.startswith("-psn_")])


if __name__ == "__main__":
    sys.exit(run())
