"""Images in the chat on a real X server (Xvfb, Qt's xcb plugin): a clipboard image pasted
through the X clipboard, thumbnails in the composer and in a sent message, the full-size
viewer, both themes (``tests.app.image_screenshots``, which also writes the screenshots)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def size_of(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        return im.size


@pytest.mark.skipif(shutil.which("xvfb-run") is None, reason="needs Debian's xvfb (.ci/run installs it)")
def test_image_conversation_on_a_real_x_display(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="xcb", MTPCHAT_HOME=str(tmp_path / "home"),
               PYTHONPATH=str(ROOT))
    out = tmp_path / "shots"
    r = subprocess.run(["xvfb-run", "-a", "-s", "-screen 0 1920x1080x24", sys.executable, "-m",
                        "tests.app.image_screenshots", str(out)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    for theme in ("light", "dark"):
        assert size_of(out / f"chat-images-{theme}-900x650.png") == (900, 650)
        assert size_of(out / f"chat-images-{theme}-1920x1080.png") == (1920, 1080)
    assert size_of(out / "viewer-dark.png")[0] >= 960  # the 960-wide image, full size
