"""Screenshots of the model manager's Catalog tab with the new MTP families (docs/screenshots/catalog).

Run on a real X display:

    xvfb-run -a -s "-screen 0 1920x1080x24" env QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD \
        python -m tests.app.catalog_screenshots docs/screenshots/catalog

The catalog is judged for this machine (its memory and measured bandwidth), with the disk
reported as 2 TB free so the memory verdicts show; the table is scrolled to the new rows
(Qwen3-Next, GLM, DeepSeek). Light and dark, at 900×650 and at full size (1920×1080).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-catalog-shots-"))


def _pump(app, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    from PySide6.QtWidgets import QApplication

    from app.chat.theme import apply_app_style, apply_theme
    from app.models.window import ModelsWindow
    from engine.hub.store import Store

    app = QApplication.instance() or QApplication(sys.argv)
    home = Path(os.environ["MTPCHAT_HOME"])
    w = ModelsWindow(store=Store(home / "models"), free_space=lambda p: 2 * 10**12,
                     auto_resume=False, scan_external=False)
    w.show()
    t = w.catalog_panel.table
    first_new = next(r for r in range(t.rowCount()) if "Next" in t.item(r, 0).text())
    for theme in ("light", "dark"):
        apply_theme(theme, app)
        apply_app_style(app)  # as the chat window does on a palette change
        for name, size in (("900x650", (900, 650)), ("1920x1080", (1920, 1080))):
            w.showNormal()
            w.resize(*size)
            _pump(app, 0.6)
            t.scrollToBottom() if size[1] < 1000 else t.scrollToTop()
            _pump(app, 0.4)
            w.grab().save(str(out / f"catalog-{theme}-{name}.png"))
        t.scrollTo(t.model().index(first_new, 0))
    w.shutdown()
    for f in sorted(out.glob("*.png")):
        print(f, f.stat().st_size)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots/catalog"))
