"""Screenshots of a tool conversation for docs/screenshots/tools (run on a real X display):

    Xvfb :24 -screen 0 1920x1080x24 & DISPLAY=:24 QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD \\
        python -m tests.tools.screenshots docs/screenshots/tools

The real ``MainWindow`` over the scripted fake engine writing Qwen3.5's tool-call form and the
real built-in ``python_doc``: a first question answered through an allowed call (its cards
collapsed, the final answer), then a second call waiting for approval. Each theme at 900×650
and 1920×1080, and with a result card opened.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-tool-shots-"))

from tests.app.screenshots import _grab, _pump, _send  # noqa: E402

STEP1 = ("<think>\nThe user asks about shlex.quote. I should read its real docstring instead of "
         "guessing.\n</think>\n\nLet me look at its documentation.\n\n<tool_call>\n"
         "<function=python_doc>\n<parameter=name>\nshlex.quote\n</parameter>\n</function>\n"
         "</tool_call>")
FINAL1 = ("<think>\nThe docstring says it returns a shell-escaped version of the string.\n</think>"
          "\n\n`shlex.quote(s)` returns a **shell-escaped** version of `s`, safe to use as one "
          "token in a shell command line:\n\n```python\nimport shlex\ncmd = f\"ls {shlex.quote"
          "(name)}\"\n```\n\nA name such as `my file; rm -rf ~` stays one harmless argument.")
STEP2 = ("<think>\nNow shlex.split: I will check its signature.\n</think>\n\n<tool_call>\n"
         "<function=python_doc>\n<parameter=name>\nshlex.split\n</parameter>\n</function>\n"
         "</tool_call>")


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    from app.chat.main_window import MainWindow
    from app.chat.settings_dialog import AppPreferences
    from app.fake.engine import FakeModel, make_fake_loader
    from app.tools import builtin
    from app.tools.result_widget import ToolResultWidget

    out = Path(argv[0] if argv else "docs/screenshots/tools")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    home = Path(os.environ["MTPCHAT_HOME"])
    fake = FakeModel(tokens_per_second=3000, think=False, scripts=[STEP1, FINAL1, STEP2])
    model_dir = home / "fake-model"
    model_dir.mkdir(exist_ok=True)
    (home / "config").mkdir(parents=True, exist_ok=True)
    script = Path(__file__).with_name("mcp_server_script.py")
    (home / "config" / "mcp.json").write_text(json.dumps({"mcpServers": {
        "test-server": {"command": sys.executable, "args": [str(script)]},
        "broken": {"command": "/opt/nowhere/mcp-server"}}}, indent=2))
    w = MainWindow(model_path=str(model_dir), loader=make_fake_loader(fake),
                   db_file=home / "shots.db")
    w.show()
    _pump(app, 1.0)
    w.tools.set_server(builtin.SERVER, True)
    _send(app, w, "What does shlex.quote do?")
    _pump(app, 0.3)
    card = next(c for mw in w.view.widgets.values() if mw.tool_panel
                for c in mw.tool_panel.cards if c.buttons)
    card.buttons["allow"].click()
    for _ in range(200):
        if not w.session.busy:
            break
        _pump(app, 0.05)
    _send(app, w, "And shlex.split?")
    _pump(app, 0.5)
    default = (w.width(), w.height())
    for theme in ("light", "dark"):
        w.apply_preferences(AppPreferences(theme=theme))
        for name, size in (("900x650", (900, 650)), ("1920x1080", (1920, 1080))):
            w.view.scroll_to_bottom()
            _grab(app, w, out / f"tools-{theme}-{name}.png", size or default)
        result = next(mw for mw in w.view.widgets.values() if isinstance(mw, ToolResultWidget))
        result.box.toggle.setChecked(True)
        w.resize(900, 650)
        _pump(app, 0.5)
        w.view.ensureWidgetVisible(result, 0, 20)
        _grab(app, w, out / f"tools-{theme}-900x650-result-open.png", None)
        result.box.toggle.setChecked(False)
        dlg = w.tools.show_dialog()
        for _ in range(100):
            if w.tools.manager.states()["test-server"].status == "ready":
                break
            _pump(app, 0.05)
        dlg.refresh()
        dlg.server_list.setCurrentRow(1)
        _grab(app, dlg, out / f"tools-window-{theme}-server.png", None)
        dlg.server_list.setCurrentRow(2)
        _grab(app, dlg, out / f"tools-window-{theme}.png", None)
        dlg.hide()
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
