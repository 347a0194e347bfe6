"""Screenshots of models served elsewhere for docs/screenshots/connect: the "Connect to a
server" dialog, the model picker with a remote model, a chat streamed from it, the dashboard
fed by its ``mtp`` stats, the Servers tab and the Cluster dialog; light and dark, at 900×650
and at full size (1920×1080; dialogs also at their own size).

    xvfb-run -a -s "-screen 0 1920x1080x24" env QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD \
        python -m tests.app.connect_screenshots docs/screenshots/connect

A real ``engine serve`` of the demo model (with an API key) on a free 127.0.0.1 port is the
server; the chat window's own engine is the scripted fake.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-connect-shots-"))

from tests.app.screenshots import _grab, _pump, _send  # noqa: E402

KEY = "sk-demo-key-123"
SIZES = {"900x650": (900, 650), "full": (1920, 1080)}


def _connect(app, w, url: str):
    d = w.remote.open_connect()
    d.url.setText(url)
    d.key.setText(KEY)
    d.test_button.click()
    for _ in range(300):
        _pump(app, 0.05)
        if d.test_button.isEnabled():
            break
    return d


def _shoot(app, out: Path, w, url: str) -> None:
    from app.chat.settings import ChatSettings
    from app.chat.settings_dialog import AppPreferences

    d = _connect(app, w, url)
    for theme in ("light", "dark"):
        w.apply_preferences(AppPreferences(theme=theme))
        _grab(app, d, out / f"connect-dialog-{theme}.png", None)
    d.save_button.click()
    _pump(app, 0.5)
    w.conversations.set_settings(w.current_conv, ChatSettings(max_tokens=160))
    _send(app, w, "What does the os module do?")
    _send(app, w, "And the json module?")
    dash = w.aux.show_dashboard()
    models = w.aux.show_models()
    models.tabs.setCurrentWidget(models.servers_panel)
    cluster = w.remote.open_cluster()
    cluster.set_hosts([("mac-studio-1", "192.168.1.20"), ("mac-studio-2", "192.168.1.21")])
    cluster.write()
    for theme in ("light", "dark"):
        w.apply_preferences(AppPreferences(theme=theme))
        for name, size in SIZES.items():
            _grab(app, w, out / f"chat-remote-{theme}-{name}.png", size)
            _grab(app, dash, out / f"dashboard-remote-{theme}-{name}.png", size)
        w.resize(900, 650)
        w.picker.combo.showPopup()
        _pump(app, 0.5)
        w.picker.combo.view().window().grab().save(str(out / f"picker-remote-{theme}.png"))
        w.picker.combo.hidePopup()
        _grab(app, models, out / f"models-servers-{theme}.png", (900, 650))
        _grab(app, cluster, out / f"cluster-dialog-{theme}.png", None)
        _grab(app, cluster, out / f"cluster-dialog-{theme}-900x650.png", (900, 650))


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    from app.chat.main_window import MainWindow
    from app.fake.engine import FakeModel, make_fake_loader
    from tests.server.conftest import start_serve

    out = Path(argv[0] if argv else "docs/screenshots/connect")
    out.mkdir(parents=True, exist_ok=True)
    home = Path(os.environ["MTPCHAT_HOME"])
    server = start_serve(Path(tempfile.mkdtemp(prefix="serve-home-")), "--api-key", KEY)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    try:
        model_dir = home / "fake-model"
        model_dir.mkdir(exist_ok=True)
        w = MainWindow(model_path=str(model_dir), db_file=home / "shots.db",
                       loader=make_fake_loader(FakeModel(tokens_per_second=3000)))
        w.show()
        _pump(app, 1.0)
        _shoot(app, out, w, server.url)
        w.close()
    finally:
        server.proc.kill()
        server.proc.wait(10)
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
