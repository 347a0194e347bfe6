"""Screenshots of a new user's first tool call, offline, on the embedded demo model (issue 30
item 3), for docs/screenshots/tools (run on a real X display):

    Xvfb :24 -screen 0 1920x1080x24 & DISPLAY=:24 QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD \\
        python -m tests.tools.demo_screenshots docs/screenshots/tools

The real ``MainWindow`` and worker on the real demo model at the chat's default sampling: the
empty chat with its examples (``demo-empty-*``), the tool example clicked and its call waiting
for Allow (``demo-confirm-*``), and the answer after the call ran (``demo-answer-*``); each
theme at 900×650 and 1920×1080.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-demo-tool-shots-"))

from tests.app.screenshots import _grab, _pump  # noqa: E402

SIZES = (("900x650", (900, 650)), ("1920x1080", (1920, 1080)))


def _wait(app, until, seconds: float) -> None:
    for _ in range(int(seconds / 0.05)):
        if until():
            return
        _pump(app, 0.05)
    raise TimeoutError("the demo did not get there in time")


def _pending(w):
    return next((c for mw in w.view.widgets.values() if mw.tool_panel
                 for c in mw.tool_panel.cards if c.state == "pending" and c.buttons), None)


def _shoot(app, w, out: Path, stem: str) -> None:
    from app.chat.settings_dialog import AppPreferences

    for theme in ("light", "dark"):
        w.apply_preferences(AppPreferences(theme=theme))
        for name, size in SIZES:
            w.view.scroll_to_bottom()
            _grab(app, w, out / f"demo-{stem}-{theme}-{name}.png", size)


def main(argv: list[str]) -> int:
    from tests.app.screenshots import demo_window

    app, w, out = demo_window(argv, "docs/screenshots/tools", "shots.db")
    _wait(app, lambda: w.model.info is not None and w.view.example_buttons, 180)
    _pump(app, 0.5)
    _shoot(app, w, out, "empty")
    w.resize(900, 650)
    next(b for b in w.view.example_buttons if b.text().endswith("(with a tool)")).click()
    _wait(app, lambda: _pending(w) is not None, 120)
    _pump(app, 0.3)
    _shoot(app, w, out, "confirm")
    _pending(w).buttons["allow"].click()
    _wait(app, lambda: not w.session.busy and not w.session.streams, 120)
    _pump(app, 0.5)
    _shoot(app, w, out, "answer")
    msgs = w.store.messages(w.current_conv)
    print("\n---\n".join(f"[{m.role}] {m.content}" for m in msgs))
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
