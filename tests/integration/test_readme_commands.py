"""README's two set-up commands: the test command is the one CI runs (verbatim), and both
work on a machine with no ``python`` alias and an externally managed system pip (they use
``python3`` to make ``.venv`` and run everything from it)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text("utf-8")
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_has_two_setup_commands_that_use_a_venv_and_python3():
    cmds = _setup_commands()
    assert len(cmds) == 2, cmds
    for cmd in cmds:
        assert "python3 -m venv .venv" in cmd
        assert not re.search(r"(^|[\s;&(])python -m", cmd), cmd  # no bare `python`
        assert "|| true" not in cmd  # a failed step must fail the command
    assert cmds[0].endswith(".venv/bin/python -m app")
    assert cmds[1].endswith(".venv/bin/python -m pytest")


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    assert _setup_commands()[1] in ci.splitlines()


def test_both_commands_install_the_listed_debian_packages_and_they_cover_qt():
    """Both install ``packaging/apt-packages.txt`` (the test command adds Xvfb for the xcb
    launch test); the list holds every package the app's start-up checks name, libglib
    included (a fresh Debian lacks it and PySide6.QtCore cannot load without it)."""
    from app.platform_check import PACKAGES

    listed = (ROOT / "packaging" / "apt-packages.txt").read_text("utf-8").split()
    for cmd in _setup_commands():
        assert "apt-get install -y $(cat packaging/apt-packages.txt)" in cmd
    assert "xvfb xauth" in _setup_commands()[1]
    assert {"python3-venv", "libopenblas0-pthread", "libglib2.0-0"} <= set(listed)
    assert set(PACKAGES.values()) <= set(listed), set(PACKAGES.values()) - set(listed)
