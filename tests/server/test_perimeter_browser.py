"""A real browser against the server (issue 27): a page from another origin tries every way a
web page can reach a localhost server (simple text/plain and typeless POSTs, no-cors fetches,
a JSON fetch behind a preflight, form posts of each encoding, a GET that would read the
models) and nothing runs; the same page from an allowed origin can use the API through CORS;
a DNS-rebound name (Chromium's host-resolver rules map it to 127.0.0.1) reads only a 403.
Headless Debian Chromium; skipped where /usr/bin/chromium is absent (CI installs it)."""
from __future__ import annotations

import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.server.test_perimeter import serve

CHROMIUM = "/usr/bin/chromium"
pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not Path(CHROMIUM).exists() or not shutil.which(CHROMIUM),
                                 reason=f"{CHROMIUM} is not installed (apt-get install chromium)")]

PAGE = """<!doctype html><html><body><pre id="out">pending</pre>
<iframe name="s1"></iframe><iframe name="s2"></iframe><iframe name="s3"></iframe>
<form method="POST" enctype="text/plain" target="s1" action="{api}/v1/chat/completions">
<input name='{{"messages":[{{"role":"user","content":"hi"}}],"max_tokens":2,"x":"' value='"}}'>
</form>
<form method="POST" target="s2" action="{api}/v1/messages"><input name="a" value="b"></form>
<form method="POST" enctype="multipart/form-data" target="s3" action="{api}/v1/completions">
<input name="prompt" value="hi"></form>
<script>
const API = "{api}";
const body = JSON.stringify({{model: "{model}", max_tokens: 2,
                              messages: [{{role: "user", content: "hi"}}]}});
const out = [];
async function attempt(name, path, init) {{
  try {{
    const r = await fetch(API + path, init);
    let text = "";
    try {{ text = (await r.text()).slice(0, 120); }} catch (e) {{}}
    out.push(name + ": " + r.type + " " + r.status + " " + text);
  }} catch (e) {{
    out.push(name + ": error " + e.name);
  }}
}}
(async () => {{
  const chat = "/v1/chat/completions";
  await attempt("simple text/plain", chat, {{method: "POST", body,
                                             headers: {{"Content-Type": "text/plain"}}}});
  await attempt("no-cors text/plain", chat, {{method: "POST", mode: "no-cors", body,
                                              headers: {{"Content-Type": "text/plain"}}}});
  await attempt("no-cors no type", chat, {{method: "POST", mode: "no-cors",
                                           body: new Blob([body])}});
  await attempt("json", chat, {{method: "POST", body,
                                headers: {{"Content-Type": "application/json"}}}});
  await attempt("anthropic json", "/v1/messages", {{method: "POST", body,
      headers: {{"Content-Type": "application/json", "x-api-key": "x"}}}});
  await attempt("read models", "/v1/models", {{}});
  if (location.hostname !== "localhost") for (const f of document.forms) f.submit();
  await new Promise(done => setTimeout(done, 1500));
  document.getElementById("out").textContent = "DONE\\n" + out.join("\\n");
}})();
</script></body></html>"""


class _Page(BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args) -> None:
        pass


def _chromium(url: str, profile: Path, *extra: str) -> str:
    """The DOM of ``url`` after its scripts ran (up to 15 s of virtual time)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=15000",
           *extra, "--dump-dom", url]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=90)
    return done.stdout


@pytest.fixture(scope="module")
def page_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def mtp(tmp_path_factory, page_server):
    s = serve(tmp_path_factory.mktemp("home"), "--allow-origin",
              f"http://localhost:{page_server}")
    _Page.page = PAGE.format(api=s.url, model=s.model).encode()
    yield s
    s.stop()


def _results(dom: str) -> dict[str, str]:
    assert "DONE" in dom, dom[-3000:]
    text = dom.split("DONE", 1)[1].split("</pre>", 1)[0]
    return dict(line.split(": ", 1) for line in text.strip().splitlines())


def test_a_foreign_page_makes_the_server_generate_nothing(mtp, page_server, tmp_path):
    before = mtp.health()
    got = _results(_chromium(f"http://127.0.0.1:{page_server}/", tmp_path / "profile"))
    print("\nforeign page:", got)
    after = mtp.health()
    assert after["completed"] == before["completed"] and after["busy"] == 0
    for name, outcome in got.items():  # unreadable: a CORS failure or an opaque reply
        assert outcome.startswith(("error TypeError", "opaque 0")), (name, outcome)
    # every request reached the perimeter and was refused there: 6 fetches (2 as preflights),
    # 3 form posts
    refused = after["refused"].get("403", 0) - before["refused"].get("403", 0)
    assert refused >= 9, (before, after)
    assert "refused a request from Origin 'http://127.0.0.1:" in "".join(mtp.stderr)


def test_an_allowed_page_can_use_the_api(mtp, page_server, tmp_path):
    before = mtp.health()["completed"]
    got = _results(_chromium(f"http://localhost:{page_server}/", tmp_path / "profile"))
    print("\nallowed page:", got)
    assert got["json"].startswith("cors 200 ") and "chat.completion" in got["json"]
    assert got["anthropic json"].startswith("cors 200 ")
    assert got["read models"].startswith("cors 200 ")
    assert got["simple text/plain"].startswith("cors 415 ")  # readable, and still refused
    assert mtp.health()["completed"] == before + 2


def test_a_rebound_name_reads_only_a_refusal(mtp, tmp_path):
    dom = _chromium(f"http://rebind.test:{mtp.port}/v1/models", tmp_path / "profile",
                    "--host-resolver-rules=MAP rebind.test 127.0.0.1")
    assert "host_not_allowed" in dom, dom[-2000:]
    assert mtp.model not in dom
