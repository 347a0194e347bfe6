"""``--self-test`` on storage that cannot take writes, and logging that cannot write.

The verdict is one line ``self-test: FAIL: <reason>`` (exit 1), never a traceback; a log file
that cannot be written (a full disk; ``/dev/full`` stands in for it) is reported once and then
left alone instead of a ``--- Logging error ---`` block per record. Read-only and full homes
are small tmpfs mounts (root only, as CI runs; skipped elsewhere): as root, chmod stops nothing.
"""
from __future__ import annotations

import errno
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

from tests.tmpfs import fill, remount, tmpfs

ROOT = Path(__file__).resolve().parents[2]


def _app(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MTPCHAT_HOME=str(home), QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=str(ROOT), MTPCHAT_SELFTEST_FAKE="1", MTPCHAT_SELFTEST_TIMEOUT="60")
    return subprocess.run([sys.executable, "-m", "app", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def _seeded(home: Path) -> None:
    r = _app(home, "--quit-after", "0.5")  # a real home: database, log file, lock
    assert r.returncode == 0, r.stderr


def _one_fail_line(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "--- Logging error ---" not in r.stderr, r.stderr
    fails = [ln for ln in r.stderr.splitlines() if ln.startswith("self-test: FAIL: ")]
    assert len(fails) == 1, r.stderr
    for w in words:
        assert w in fails[0], fails[0]


def test_self_test_on_a_read_only_home_fails_in_one_line(tmp_path):
    with tmpfs(tmp_path / "home", "2m") as home:
        _seeded(home)
        remount(home, "ro")
        r = _app(home, "--self-test")
        remount(home, "rw")
    _one_fail_line(r, "replies cannot be saved", "chats.sqlite3", "cannot be written")


def test_self_test_on_a_full_disk_fails_in_one_line(tmp_path):
    with tmpfs(tmp_path / "home", "2m") as home:
        _seeded(home)
        fill(home / "filler")
        r = _app(home, "--self-test")
    _one_fail_line(r, "replies cannot be saved", "chats.sqlite3")
    assert len(r.stderr.splitlines()) < 40, r.stderr


def test_a_log_file_on_a_full_disk_is_reported_once(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "mtpchat.log").symlink_to("/dev/full")  # every write: ENOSPC
    r = _app(tmp_path, "--self-test")
    assert r.returncode == 0, r.stderr
    assert "--- Logging error ---" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    reports = [ln for ln in r.stderr.splitlines() if "logging to" in ln]
    assert len(reports) == 1 and "No space left on device" in reports[0], r.stderr


class _FullStream(io.StringIO):
    def write(self, s: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_the_engine_log_handler_gives_up_after_one_line(capsys):
    from engine.loghandlers import QuietStreamHandler

    handler = QuietStreamHandler(_FullStream())
    logger = logging.getLogger("tests.quiet-handler")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(200):
            logger.warning("record %d", i)
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert "--- Logging error ---" not in err
    assert err.count("\n") == 1 and "No space left on device" in err and "stderr" in err


def test_the_engine_cli_with_stderr_on_a_full_disk_exits_normally(tmp_path):
    """``2>/dev/full``: every warning line fails; the command still ends as it would. (Without
    ``PYTHONUNBUFFERED``, as in a user's shell: the failed line stays in stderr's buffer and
    the interpreter's last flush at exit failed too, exit status 120.)"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "engine", "-v", "info"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=full, text=True, timeout=120,
                           env=dict(env, MTPCHAT_HOME=str(tmp_path)))
    assert r.returncode == 0
