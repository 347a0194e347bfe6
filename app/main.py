"""Entry point: ``python -m app`` / ``mtpchat``."""
from __future__ import annotations

import argparse
import logging
import sys

from app import __version__

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mtpchat", description="MTP Chat: local chat with MTP speculative decoding")
    p.add_argument("--version", action="version", version=f"MTP Chat {__version__}")
    p.add_argument("--model", help="model folder to load instead of the embedded demo model")
    p.add_argument("--self-test", action="store_true",
                   help="start offscreen-capable, chat once with the default model, check, exit 0/1")
    p.add_argument("--quit-after", type=float, default=None, metavar="SECONDS",
                   help="close the window after SECONDS (smoke tests)")
    return p.parse_args(argv)


def _lock_data_folder():
    """(lock, None) to go on; (None, exit code) when another MTP Chat uses the folder."""
    from app import instance
    from app.paths import data_dir

    try:
        return instance.acquire(data_dir()), None
    except instance.AlreadyRunningError as exc:
        print(f"mtpchat: {exc}", file=sys.stderr)
        _tell_user("MTP Chat is already running", str(exc))
        return None, 3
    except OSError as exc:  # a read-only or missing data folder: the store explains it later
        log.warning("running without the single-instance lock: %s", exc)
        return None, None


from app.qt_app import APP_ID, APP_NAME, application  # noqa: F401  (the app's QApplication)


def _tell_user(title: str, text: str) -> None:
    """A dialog where a person can see one (not on the offscreen platform: nobody would)."""
    import os

    if os.environ.get("QT_QPA_PLATFORM", "") in ("offscreen", "minimal"):
        return
    from PySide6.QtWidgets import QMessageBox

    application()
    QMessageBox.warning(None, title, text)


def _startup_failed(exc: BaseException) -> None:
    """The window could not be built: one line on stderr, a dialog, the traceback in the log,
    exit 1. ``os._exit``: the worker thread may already run, and Qt aborts the process if
    the interpreter tears down a running QThread."""
    import os

    from app.errors import describe

    log.debug("MTP Chat could not start", exc_info=exc)  # the traceback goes to the log file only
    print(f"mtpchat: could not start: {describe(exc)} (details in the log)", file=sys.stderr)
    _tell_user("MTP Chat could not start", describe(exc))
    logging.shutdown()
    os._exit(1)


def run() -> int:
    """The process entry (``python -m app``, ``mtpchat``): the app runs MLX only, so an
    installed torch stays out of it (engine/torchless.py). Not in :func:`main`, which tests
    call in a process that also runs torch references."""
    from engine.torchless import keep_torch_out

    keep_torch_out()
    return main()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from app.logging_setup import install_qt_message_handler, setup_logging

    setup_logging()
    from app.platform_check import advice, missing_libraries, qt_core_missing

    missing = qt_core_missing()
    if missing:
        print(f"mtpchat: {advice(missing, 'Qt')}", file=sys.stderr)
        return 4
    install_qt_message_handler()
    from engine.decoding.window import check_draft_settings

    try:
        check_draft_settings()  # a bad setting ends here in one line, not in the engine's thread
    except ValueError as exc:
        print(f"mtpchat: {exc}", file=sys.stderr)
        return 2
    log.info("MTP Chat %s starting (python %s)", __version__, sys.version.split()[0])
    lock, rc = _lock_data_folder()
    if rc is not None:
        return rc
    if args.self_test:
        from app.selftest import run_self_test

        return run_self_test(args)
    missing = missing_libraries()
    if missing:
        print(f"mtpchat: {advice(missing)}", file=sys.stderr)
        return 4
    from PySide6.QtCore import QTimer

    from app.chat.main_window import MainWindow

    qapp = application()
    try:
        window = MainWindow(model_path=args.model)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: say it, never abort
        _startup_failed(exc)
    window.show()
    if args.quit_after is not None:
        QTimer.singleShot(int(args.quit_after * 1000), window.close)
    rc = qapp.exec()
    log.info("MTP Chat exiting with %s", rc)
    return rc
