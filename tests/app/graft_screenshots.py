"""Screenshots of the model manager offering and completing "Add MTP head" (docs/screenshots/graft).

Run on a real X display:

    Xvfb :21 -screen 0 1600x1000x24 &
    DISPLAY=:21 QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD python -m tests.app.graft_screenshots \
        docs/screenshots/graft

A fake Hub (tests/fakehub.py) serves the demo model's raw repo and a tiny random one; LM Studio's
folder (a temporary one) holds their headless ``mlx_lm.convert`` 4-bit conversions.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HOME = Path(tempfile.mkdtemp(prefix="mtpchat-graft-shots-"))
os.environ["MTPCHAT_HOME"] = str(HOME / "home")
os.environ["HF_HUB_OFFLINE"] = "0"
os.environ["HF_HUB_CACHE"] = str(HOME / "hf")
os.environ["LMSTUDIO_MODELS_DIR"] = str(HOME / "lms")
os.environ["MTPLX_MODEL_DIR"] = str(HOME / "mtplx")


def _pump(app, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def _until(app, cond, timeout: float = 90.0) -> None:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        _pump(app, 0.05)


def _setup() -> dict:
    from tests.graftrepos import CARD, DEMO_REPO, DENSE_REPO, conversion, fake_repos
    from tests.tinymodels import build_tiny_model

    from engine.paths import default_model_path

    from tests.fakehub import FakeRepo

    srcs = {DEMO_REPO: default_model_path(),
            DENSE_REPO: build_tiny_model(HOME / "src" / "dense", seed=3, shards=2)}
    repos = fake_repos(srcs)
    for repo, name in ((DEMO_REPO, "mlx-community/mtp-demo-4bit"),
                       (DENSE_REPO, "mlx-community/tiny-dense-4bit")):
        out = conversion(srcs[repo], HOME / "lms" / name, bits=4)
        (out / "README.md").write_text(CARD.format(repo=repo))
        repos[name] = FakeRepo({p.name: p.read_bytes() for p in out.iterdir() if p.is_file()})
    return repos


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    repos = _setup()
    from PySide6.QtWidgets import QApplication

    from tests.fakehub import FakeHub

    app = QApplication.instance() or QApplication(sys.argv)
    with FakeHub(repos) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        from app.models.window import ModelsWindow
        from engine.hub.store import Store

        w = ModelsWindow(store=Store(HOME / "models"), auto_resume=False)
        w.resize(1180, 560)
        w.show()
        w.tabs.setCurrentIndex(3)
        p = w.installed_panel
        _until(app, lambda: len(p.external) == 2 and p.installed_buttons["graft"] is not None)
        p.select_model("mlx-community/mtp-demo-4bit")
        _pump(app, 0.5)
        w.grab().save(str(out / "offer.png"))
        hub.chunk_size, hub.chunk_delay_s = 16 * 1024, 0.02
        p.installed_buttons["graft"].click()
        _until(app, lambda: "Downloading" in p.graft_bar.status.text())
        _pump(app, 0.6)
        w.grab().save(str(out / "downloading.png"))
        hub.chunk_delay_s = 0.0
        _until(app, lambda: p.graft_job.state != "running")
        _until(app, lambda: any(r.name.endswith("-mtp") for r in p.installed))
        p.select_model("mlx-community--mtp-demo-4bit-mtp")
        _pump(app, 0.5)
        w.grab().save(str(out / "done.png"))
        p.select_model("mlx-community/tiny-dense-4bit")
        p.installed_buttons["graft"].click()
        _until(app, lambda: p.graft_job.state != "running")
        _pump(app, 0.5)
        w.grab().save(str(out / "refused.png"))
        w.tabs.setCurrentIndex(1)  # the check before download says what a graft costs
        w.check_repo("mlx-community/mtp-demo-4bit")
        _until(app, lambda: "MTP head available" in w.add_panel.report_label.text())
        _pump(app, 0.5)
        w.grab().save(str(out / "check.png"))
        w.shutdown()
    for f in sorted(out.glob("*.png")):
        print(f, f.stat().st_size)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots/graft"))
