"""The app starts on a real X server (Xvfb) with Qt's xcb platform plugin, not only offscreen:
a fresh machine once aborted at launch for two libxcb libraries no offscreen test could see."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("xvfb-run") is None, reason="needs Debian's xvfb (.ci/run installs it)")
def test_app_starts_and_quits_on_a_real_x_display(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="xcb", MTPCHAT_HOME=str(tmp_path),
               PYTHONPATH=str(ROOT))
    r = subprocess.run(["xvfb-run", "-a", sys.executable, "-m", "app", "--quit-after", "2"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert "could not load the Qt platform plugin" not in r.stderr
    assert "loaded" in r.stderr  # the demo model was loaded on the worker, on the xcb platform
