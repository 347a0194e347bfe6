"""A fresh server imports what its requests need before it listens
(``engine.server.runner.PRELOAD``): its first streamed reply imports no module of the
engine, of anyio or of platformdirs in the request's own time (anyio's asyncio backend alone
cost a first 4-stream burst 76 ms; the decoding package some twenty modules). Run in a fresh
interpreter: in the test process every module is already imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, os, sys
import engine
from engine.server.runner import start_server
srv = start_server(engine.load(engine.default_model_path()), port=0, max_streams=2)
import httpx  # the client's own modules, before the snapshot
body = {"messages": [{"role": "user", "content": "What does os.path.join do?"}],
        "max_tokens": 6, "temperature": 0, "stream": True}
with httpx.Client(timeout=120) as c:
    c.get(srv.url + "/health")
    before = set(sys.modules)
    with c.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
        status, lines = r.status_code, [ln for ln in r.iter_lines() if ln.startswith("data:")]
print(json.dumps({"status": status, "events": len(lines),
                  "new": sorted(set(sys.modules) - before)}))
sys.stdout.flush()
os._exit(0)
'''


def test_a_fresh_servers_first_reply_imports_nothing_of_its_own(tmp_path):
    env = dict(os.environ, MTP_WARMUP="0", MTPCHAT_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, timeout=300,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == 200 and got["events"] >= 2
    mine = [m for m in got["new"] if m.split(".")[0] in ("engine", "anyio", "platformdirs",
                                                          "starlette", "uvicorn")]
    assert mine == [], f"imported by the first request: {mine}"
