"""Issue 35's screenshots: every window on the embedded demo model, as a user sees it.

    Xvfb :25 -screen 0 1600x1000x24 &
    DISPLAY=:25 QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD python -m tests.app.newcomer_shots OUT

A temporary home and database; the real ``MainWindow``, worker and demo model at the default
chat settings. ``--sheets DIR`` then makes the contact sheets committed under
docs/screenshots/newcomer/ from DIR's grabs. Grabs, in the light and the dark theme: the dashboard idle; a two-turn chat
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


SHEETS = {  # sheet name -> (grabs, columns)
    **{f"chat-{t}": ([f"chat-{t}-{s}{o}" for s in SIZES for o in ("", "-settings")], 2)
       for t in ("light", "dark")},
    "dashboard": ([f"dashboard-{k}" for k in ("idle-light", "idle-dark", "light-default",
                                             "dark-default", "light-1440x900", "dark-1440x900")],
                  2),
    **{f"models-{t}": ([f"models-{t}-tab{i}-900x650" for i in range(5)], 2)
       for t in ("light", "dark")},
    "dialogs": ([f"{d}-{t}" for d in ("settings", "about") for t in ("light", "dark")], 2),
}


def contact_sheets(src: Path, out: Path, width: int = 480) -> None:
    """One PNG per window: its grabs scaled to ``width``, captioned, in a grid."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QColor, QImage, QPainter

    for name, (grabs, cols) in SHEETS.items():
        images = []
        for g in grabs:
            img = QImage(str(src / f"{g}.png"))
            images.append((g, img.scaledToWidth(min(width, img.width()),
                                                Qt.TransformationMode.SmoothTransformation)))
        rows = (len(images) + cols - 1) // cols
        cell_h = max(i.height() for _, i in images) + 22
        sheet = QImage(cols * (width + 10) + 10, rows * cell_h + 10, QImage.Format.Format_RGB32)
        sheet.fill(QColor("#ffffff"))
        p = QPainter(sheet)
        for k, (caption, img) in enumerate(images):
            x, y = 10 + (k % cols) * (width + 10), 10 + (k // cols) * cell_h
            p.setPen(QColor("#202124"))
            p.drawText(x, y + 12, caption)
            p.drawImage(x, y + 18, img)
        p.end()
        sheet.save(str(out / f"sheet-{name}.png"), "PNG", 0)
        print(out / f"sheet-{name}.png", flush=True)


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    if argv[:1] == ["--sheets"]:
        app = QApplication.instance() or QApplication(sys.argv[:1])  # noqa: F841 (fonts)
        contact_sheets(Path(argv[1]), Path(argv[2] if len(argv) > 2 else
                                           "docs/screenshots/newcomer"))
        return 0

    from app.chat.settings_dialog import AppPreferences
    from tests.app.screenshots import demo_window

    app, w, out = demo_window(argv, "docs/screenshots/newcomer", "chats.db")
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
