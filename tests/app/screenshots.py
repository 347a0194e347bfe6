"""Screenshots of the chat window and the dashboard (and the model manager) for docs/screenshots.

Run on a real X display (Xvfb) with the xcb platform where possible:

    xvfb-run -a -s "-screen 0 1920x1080x24" env QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD \
        python -m tests.app.screenshots docs/screenshots

Drives the real ``MainWindow`` over the scripted fake engine (a temporary home and database):
one chat with a Markdown reply, then grabs each window at its default size, at 900×650 and at
1920×1080, in the light and the dark theme (chat window also with the settings panel open).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-shots-"))

SIZES = {"default": None, "900x650": (900, 650), "1920x1080": (1920, 1080)}
PROMPT = "How do I iterate by hand? Explain `it.__next__()` and `__init__`."


def demo_window(argv: list[str], default_out: str, db_name: str):
    """(app, window, out folder) for the screenshot scripts that run the real demo model: the
    output folder from ``argv`` (created), a ``MainWindow`` on the demo in ``$MTPCHAT_HOME``,
    shown."""
    from PySide6.QtWidgets import QApplication

    from app.chat.main_window import MainWindow
    from engine.resources import default_model_path

    out = Path(argv[0] if argv else default_out)
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    home = Path(os.environ["MTPCHAT_HOME"])
    w = MainWindow(model_path=str(default_model_path()), db_file=home / db_name)
    w.show()
    return app, w, out


def _pump(app, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def _grab(app, widget, path: Path, size) -> None:
    if size is not None:
        widget.showNormal()
        widget.resize(*size)
    _pump(app, 0.6)
    widget.grab().save(str(path))
    print(path)


def _wait(app, w) -> None:
    end = time.monotonic() + 20
    while w.session.streams and time.monotonic() < end:
        _pump(app, 0.05)


def _send(app, w, text: str) -> None:
    w.composer.edit.setPlainText(text)
    w.composer.button.click()
    _wait(app, w)


def _chat(app, out: Path, fake_loader, home: Path):
    from app.chat.main_window import MainWindow
    from app.chat.settings_dialog import AppPreferences

    model_dir = home / "fake-model"
    model_dir.mkdir(exist_ok=True)
    w = MainWindow(model_path=str(model_dir), loader=fake_loader, db_file=home / "shots.db")
    w.show()
    _pump(app, 1.0)
    notes = home / "notes.md"
    notes.write_text("# Notes\nIterators implement __next__.\n", encoding="utf-8")
    w.composer.attach_paths([str(notes)])
    _send(app, w, PROMPT)
    w.view.widgets[max(w.view.widgets)].regen_button.click()  # a second version: "‹ 2/2 ›"
    _wait(app, w)
    w.composer.edit.setPlainText("line 1\nline 2\nline 3\nline 4\nline 5")
    default = (w.width(), w.height())
    dash_default = None
    for theme in ("light", "dark"):
        w.apply_preferences(AppPreferences(theme=theme))
        for name, size in SIZES.items():
            _grab(app, w, out / f"chat-{theme}-{name}.png", size or default)
            w.settings_button.setChecked(True)
            _grab(app, w, out / f"chat-{theme}-{name}-settings.png", size or default)
            w.settings_button.setChecked(False)
        dash = w.aux.show_dashboard()
        dash_default = dash_default or (dash.width(), dash.height())
        for name, size in SIZES.items():
            _grab(app, dash, out / f"dashboard-{theme}-{name}.png", size or dash_default)
        models = w.aux.show_models()
        _grab(app, models, out / f"models-{theme}-default.png", None)
        models.hide()
        dash.hide()
    return w


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    from app.fake.engine import FakeModel, make_fake_loader

    out = Path(argv[0] if argv else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    home = Path(os.environ["MTPCHAT_HOME"])
    w = _chat(app, out, make_fake_loader(FakeModel(tokens_per_second=3000)), home)
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
