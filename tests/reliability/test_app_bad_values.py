"""The real app as a subprocess over a sound chat database holding one bad value.

Each value once stopped every launch with "could not start: Internal error: ...". Now the
app starts (exit 0), the chat is still listed, the status bar names it, and a log line names
the database file and the chat. The bad value stays on disk as it was.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.db import ChatStore

ROOT = Path(__file__).resolve().parents[2]
TITLE = "Victim chat"
# The real entry point, with a read-only look at the window just before it closes.
PROBE = """
import json, sys
import app.chat.main_window as mw
shutdown = mw.MainWindow.shutdown
def probe(self):
    if not self._closed:
        items = [self.sidebar.list.item(i).text() for i in range(self.sidebar.list.count())]
        print("PROBE " + json.dumps({"chats": items, "notice": self.data_notice.toolTip(),
                                     "shown": self.data_notice_box.isVisible(),
                                     "messages": len(self.view.widgets)}), flush=True)
    shutdown(self)
mw.MainWindow.shutdown = probe
from app.main import main
sys.exit(main(sys.argv[1:]))
"""
DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000
BAD = {  # case -> (SQL applied to the victim chat's rows, what the notice says)
    "meta-nested-1e5-deep": ("UPDATE messages SET meta=:v WHERE id=:mid", DEEP, "details"),
    "settings-top-k-1e300": ("UPDATE conversations SET settings=:v WHERE id=:cid",
                             '{"top_k": 1e300}', "top_k"),
    "settings-max-tokens-infinity": ("UPDATE conversations SET settings=:v WHERE id=:cid",
                                     '{"max_tokens": Infinity, "temperature": NaN}',
                                     "max_tokens"),
    "meta-stats-a-string": ("UPDATE messages SET meta=:v WHERE id=:mid", '{"stats": "x"}',
                            "stats"),
    "meta-wrong-types": ("UPDATE messages SET meta=:v WHERE id=:mid",
                         '{"think_s": "x", "draft_spans": 3, "model": 5, "status": "done"}',
                         "think_s"),
    "message-created-at-abc": ("UPDATE messages SET created_at=:v WHERE id=:mid", "abc",
                               "time"),
    "chat-created-at-abc": (("UPDATE conversations SET created_at=:v, updated_at=:v "
                             "WHERE id=:cid"), "abc", "creation time"),
}


def _seed(home: Path, sql: str, value: str) -> Path:
    db = home / "data" / "chats.sqlite3"
    s = ChatStore(db)
    other = s.create_conversation(title="Untouched chat")
    s.add_message(other, "user", "fine")
    cid = s.create_conversation(title=TITLE)
    s.add_message(cid, "user", "hello")
    mid = s.add_message(cid, "assistant", "a reply", meta={"status": "done", "stats": {
        "tokens": 3, "tokens_per_s": 10.0}})
    s.close()
    con = sqlite3.connect(db)
    con.execute(sql, {"v": value, "cid": cid, "mid": mid})
    con.commit()
    con.close()
    return db


@pytest.mark.parametrize("case", list(BAD))
def test_one_bad_value_does_not_stop_the_app(tmp_path, case):
    sql, value, what = BAD[case]
    db = _seed(tmp_path, sql, value)
    env = dict(os.environ, MTPCHAT_HOME=str(tmp_path), QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", PROBE, "--quit-after", "2"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "could not start" not in r.stderr, r.stderr
    probe = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("PROBE "))[6:])
    assert TITLE in probe["chats"] and "Untouched chat" in probe["chats"]
    assert probe["shown"] and TITLE in probe["notice"] and what in probe["notice"], probe
    assert probe["messages"] == 2  # the victim chat (the most recent) opened, both messages
    logged = [ln for ln in r.stderr.splitlines() if "ignored a bad value" in ln]
    assert logged and str(db) in logged[0] and TITLE in logged[0], r.stderr
    con = sqlite3.connect(db)  # left as it was (nothing rewritten behind the user's back)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = {v for row in con.execute("SELECT meta, created_at FROM messages UNION ALL "
                                       "SELECT settings, created_at FROM conversations")
              for v in row}
    con.close()
    assert value in stored
