"""The real app as a subprocess against broken or hostile storage, and killed mid-reply.

Each case asserts the exit code, that stderr has no Traceback, and that the message names the
problem; the chat database is checked with ``PRAGMA integrity_check`` and every message saved
before the fault must still be there.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.db import ChatStore
from tests.tmpfs import remount, tmpfs

ROOT = Path(__file__).resolve().parents[2]


def _env(home: Path, **extra: str) -> dict:
    env = dict(os.environ, MTPCHAT_HOME=str(home), QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=str(ROOT), MTPCHAT_SELFTEST_TIMEOUT="60")
    env.update(extra)
    return env


def _app(home: Path, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], env=_env(home, **extra),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _seed(home: Path, n: int = 6) -> tuple[Path, list[str]]:
    db = home / "data" / "chats.sqlite3"
    s = ChatStore(db)
    cid = s.create_conversation(title="Saved before")
    texts = [f"saved {i}" for i in range(n)]
    for i, t in enumerate(texts):
        s.add_message(cid, "user" if i % 2 == 0 else "assistant", t)
    s.close()
    return db, texts


def _saved(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [r[0] for r in con.execute("SELECT content FROM messages ORDER BY id")]
    finally:
        con.close()


def test_corrupt_database_is_moved_aside_and_the_app_starts(tmp_path):
    (tmp_path / "data").mkdir()
    junk = os.urandom(30000)
    (tmp_path / "data" / "chats.sqlite3").write_bytes(junk)
    r = _app(tmp_path, "--quit-after", "1")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "damaged" in r.stderr and "corrupt-" in r.stderr
    backups = list((tmp_path / "data").glob("chats.sqlite3.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == junk


def test_bad_json_in_rows_does_not_stop_the_app(tmp_path):
    db, texts = _seed(tmp_path)
    con = sqlite3.connect(db)
    con.execute("UPDATE messages SET meta='{broken' WHERE id=1")
    con.execute("UPDATE conversations SET settings='not json'")
    con.execute("INSERT INTO app_settings VALUES ('preferences', '{{{')")
    con.commit()
    con.close()
    r = _app(tmp_path, "--quit-after", "1")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert _saved(db) == texts


def test_database_path_is_a_folder(tmp_path):
    (tmp_path / "data" / "chats.sqlite3").mkdir(parents=True)
    r = _app(tmp_path, "--quit-after", "1")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "is a folder" in r.stderr


def test_a_second_instance_on_the_same_folder_is_refused(tmp_path):
    db, texts = _seed(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "app", "--quit-after", "20"],
                             env=_env(tmp_path), cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / "data" / "mtpchat.lock"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (lock.exists() and lock.read_text().strip()):
            time.sleep(0.1)
        r = _app(tmp_path, "--quit-after", "1")
        assert r.returncode == 3, r.stderr
        assert "Traceback" not in r.stderr and "already running" in r.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    assert _saved(db) == texts


def _streaming_rows(db: Path) -> int:
    try:
        con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=0.05)
        try:
            rows = con.execute("SELECT meta FROM messages WHERE role='assistant'").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return 0
    return sum(1 for (m,) in rows if json.loads(m or "{}").get("status") == "streaming")


@pytest.mark.parametrize("attempt", range(10))
def test_kill_9_during_a_streamed_reply_loses_nothing(tmp_path, attempt):
    db, texts = _seed(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "app", "--self-test"],
                         env=_env(tmp_path, MTPCHAT_SELFTEST_FAKE="1",
                                  MTPCHAT_SELFTEST_FAKE_TPS="60"),
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _streaming_rows(db):
            assert p.poll() is None, "the app ended before streaming"
            time.sleep(0.02)
        assert _streaming_rows(db), "no reply was streaming"
        time.sleep(0.05 * attempt)  # kill at a different point of the reply each time
    finally:
        p.kill()
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    saved = _saved(db)
    assert saved[: len(texts)] == texts  # everything saved before the fault is still there
    # The next start marks the cut reply as interrupted and keeps its text.
    store = ChatStore(db)
    assert store.mark_interrupted() == 1
    store.close()


def test_missing_xcb_libraries_are_named_with_the_apt_command(monkeypatch):
    from app import platform_check

    monkeypatch.setattr(platform_check, "missing_libraries",
                        lambda: ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    msg = platform_check.advice(platform_check.missing_libraries())
    assert "libxcb-icccm.so.4" in msg
    assert "sudo apt-get install -y libxcb-icccm4 libxcb-keysyms1" in msg


def test_no_library_is_missing_on_this_machine_for_xcb(monkeypatch):
    from app import platform_check

    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    assert platform_check.missing_libraries() == []  # .ci/run installs them all


def test_a_read_only_home_starts_and_shows_the_saved_chats(tmp_path):
    with tmpfs(tmp_path / "home", "2m") as home:
        db, texts = _seed(home)
        remount(home, "ro")
        r = _app(home, "--quit-after", "1")
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        assert "cannot write the log file" in r.stderr
        assert "cannot be written" in r.stderr and "Your chats are shown" in r.stderr
        remount(home, "rw")
        assert _saved(db) == texts


def test_a_window_that_cannot_be_built_exits_1_with_one_line(tmp_path):
    # A bug anywhere in building the window stands in for every start-up failure.
    (tmp_path / "data").mkdir()
    code = ("import sys, app.chat.main_window as mw\n"
            "def boom(*a, **k): raise RuntimeError('simulated start-up bug')\n"
            "mw.MainWindow.__init__ = boom\n"
            "from app.main import main\n"
            "sys.exit(main(['--quit-after', '1']))\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "could not start: Internal error: RuntimeError: simulated start-up bug" in r.stderr


def test_generate_with_a_read_only_home_still_answers_without_a_traceback(tmp_path):
    """The prompt cache on disk cannot be written: generation goes on, one warning line."""
    with tmpfs(tmp_path / "home", "1m") as home:
        (home / "data").mkdir()
        remount(home, "ro")
        prompt = ",".join(["7"] * 1200)  # long enough for the disk cache to want it
        r = subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt-ids", prompt,
                            "--max-tokens", "4", "--depth", "2", "--json"], env=_env(home),
                           cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        assert "prompt cache on disk turned off: [Errno 30] Read-only file system" in r.stderr
        assert len(json.loads(r.stdout)["token_ids"]) == 4


def test_a_missing_qt_core_library_is_named_with_the_apt_command(monkeypatch):
    """A fresh Debian has no libglib-2.0 until a desktop package brings it: PySide6.QtCore
    then fails to import, on any platform (offscreen too). One line names the package."""
    import builtins

    from app import platform_check

    real_import = builtins.__import__

    def no_glib(name, *args, **kwargs):
        if name == "PySide6.QtCore":
            raise ImportError("libglib-2.0.so.0: cannot open shared object file: "
                              "No such file or directory")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_glib)
    missing = platform_check.qt_core_missing()
    assert missing == ["libglib-2.0.so.0"]
    msg = platform_check.advice(missing, "Qt")
    assert msg.startswith("Qt cannot load: missing libglib-2.0.so.0.")
    assert msg.endswith("sudo apt-get install -y libglib2.0-0")
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert platform_check.qt_core_missing() == []  # this machine has it
