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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from app.logging_setup import install_qt_message_handler, setup_logging

    setup_logging()
    install_qt_message_handler()
    log.info("MTP Chat %s starting (python %s)", __version__, sys.version.split()[0])
    if args.self_test:
        from app.selftest import run_self_test

        return run_self_test(args)
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.chat.main_window import MainWindow

    qapp = QApplication.instance() or QApplication(sys.argv[:1])
    qapp.setApplicationName("MTP Chat")
    qapp.setApplicationVersion(__version__)
    window = MainWindow(model_path=args.model)
    window.show()
    if args.quit_after is not None:
        QTimer.singleShot(int(args.quit_after * 1000), window.close)
    rc = qapp.exec()
    log.info("MTP Chat exiting with %s", rc)
    return rc
