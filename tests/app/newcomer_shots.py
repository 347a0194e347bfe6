"""Issue 35's screenshots: every window on the embedded demo model, as a user sees it.

    Xvfb :25 -screen 0 1600x1000x24 &
    DISPLAY=:25 QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD python -m tests.app.newcomer_shots OUT

A temporary home and database; the real ``MainWindow``, worker and demo model at the default
chat settings. Grabs, in the light and the dark theme: the dashboard idle; a two-turn chat
(900×650 and 1440×900, the chat settings panel closed and open); the dashboard after the
replies; each tab of the model manager; the Settings dialog and the About box.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-newcomer-"))

SIZES = {"900x650": (900, 650), "1440x900": (1440, 900)}
QUESTIONS = ("What does `json.dumps` do?", "What does `itertools.chain` do?")


def _pump(app, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def _grab(app, widget, path: Path, size=None) -> None:
    if size is not None:
        widget.showNormal()
        widget.resize(*size)
    _pump(app, 0.8)
    widget.grab().save(str(path))
    print(path, flush=True)


def _modal(app, path: Path, opener) -> None:
    """Grab the modal dialog ``opener()`` shows, then close it."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    def grab_and_close() -> None:
        dlg = QApplication.activeModalWidget()
        if dlg is None:
            QTimer.singleShot(200, grab_and_close)
            return
        _pump(app, 0.5)
        dlg.grab().save(str(path))
        print(path, flush=True)
        dlg.reject()

    QTimer.singleShot(500, grab_and_close)
    opener()


def _wait(app, w, seconds: float = 120) -> None:
    end = time.monotonic() + seconds
    while w.session.streams and time.monotonic() < end:
        _pump(app, 0.05)


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    from app.chat.main_window import MainWindow
    from app.chat.settings_dialog import AppPreferences
    from engine.resources import default_model_path

    out = Path(argv[0] if argv else "docs/screenshots/newcomer")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    home = Path(os.environ["MTPCHAT_HOME"])
    w = MainWindow(model_path=str(default_model_path()), db_file=home / "chats.db")
    w.show()
    end = time.monotonic() + 120
    while w.model.info is None and time.monotonic() < end:
        _pump(app, 0.1)
    for theme in ("light", "dark"):  # the dashboard before any reply
        w.apply_preferences(AppPreferences(theme=theme))
        dash = w.aux.show_dashboard()
        _grab(app, dash, out / f"dashboard-idle-{theme}.png", (1240, 770))
        dash.hide()
    for q in QUESTIONS:
        w.composer.edit.setPlainText(q)
        w.composer.button.click()
        _pump(app, 0.2)
        _wait(app, w)
    for theme in ("light", "dark"):
        w.apply_preferences(AppPreferences(theme=theme))
        for name, size in SIZES.items():
            _grab(app, w, out / f"chat-{theme}-{name}.png", size)
            w.composer.think_button.setChecked(True)  # the Think toggle's "on" state
            w.settings_button.setChecked(True)
            _grab(app, w, out / f"chat-{theme}-{name}-settings.png", size)
            w.settings_button.setChecked(False)
            w.composer.think_button.setChecked(False)
        dash = w.aux.show_dashboard()
        for name, size in (("default", (1240, 770)), ("1440x900", (1440, 900))):
            _grab(app, dash, out / f"dashboard-{theme}-{name}.png", size)
        dash.hide()
        models = w.aux.show_models()
        for i in range(models.tabs.count()):
            models.tabs.setCurrentIndex(i)
            for name, size in SIZES.items():
                _grab(app, models, out / f"models-{theme}-tab{i}-{name}.png", size)
        models.hide()
        w.activateWindow()
        _modal(app, out / f"settings-{theme}.png", w.open_defaults)
        _modal(app, out / f"about-{theme}.png", w.show_about)
    w.close()
    _pump(app, 0.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
