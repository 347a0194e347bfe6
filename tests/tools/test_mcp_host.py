"""``app.tools.host.McpHost`` against real MCP servers: one written with the ``mcp`` SDK
(``mcp_server_script.py``, over stdio) and the official filesystem server from npm."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.tools.config import ServerSpec, filesystem_server, parse_server
from app.tools.host import McpHost

SCRIPT = Path(__file__).with_name("mcp_server_script.py")


def wait_for(host: McpHost, name: str, *statuses: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = host.states()[name]
        if state.status in statuses:
            return state
        time.sleep(0.02)
    raise AssertionError(f"{name} stayed {host.states()[name]}")


@pytest.fixture
def host(tmp_path):
    h = McpHost(log_dir=tmp_path / "logs")
    yield h
    h.shutdown()


@pytest.fixture
def server(host):
    host.configure({"t": ServerSpec("t", command=sys.executable, args=(str(SCRIPT),))})
    return wait_for(host, "t", "ready", "error")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One host and server for the tests that leave it running (a server start costs 1-5 s)."""
    h = McpHost(log_dir=tmp_path_factory.mktemp("logs"))
    h.configure({"t": ServerSpec("t", command=sys.executable, args=(str(SCRIPT),))})
    yield h, wait_for(h, "t", "ready", "error")
    h.shutdown()


def test_nothing_starts_without_servers(host):
    host.configure({})
    assert not host.running
    host.configure({"off": ServerSpec("off", command="x", disabled=True)})
    assert not host.running and host.states()["off"].status == "disabled"


def test_lists_and_calls_tools(shared):
    host, server = shared
    assert server.status == "ready", server.error
    names = [t.name for t in server.tools]
    assert names[:3] == ["add", "echo", "fail"]
    assert host.call("t", "header", {"name": "X-Client"}, 10).result(10).text == "(none)"
    add = server.tools[0]
    assert add.schema["properties"]["a"]["type"] == "integer"
    result = host.call("t", "add", {"a": 2, "b": 40}, 10).result(10)
    assert (result.text, result.is_error) == ("42", False)
    assert host.call("t", "echo", {"text": "é ✓"}, 10).result(10).text == "é ✓"


def test_tool_error_is_a_result(shared):
    host, server = shared
    result = host.call("t", "fail", {"message": "boom"}, 10).result(10)
    assert result.is_error and "fail" in result.text
    assert host.states()["t"].status == "ready"


def test_hung_tool_times_out_and_the_server_lives_on(shared):
    host, server = shared
    t0 = time.monotonic()
    result = host.call("t", "hang", {"seconds": 30}, 0.5).result(10)
    assert result.is_error and "did not answer within 0.5 s" in result.text
    assert time.monotonic() - t0 < 5
    assert host.call("t", "add", {"a": 1, "b": 1}, 10).result(10).text == "2"


def test_cancelled_call(shared):
    host, server = shared
    fut = host.call("t", "hang", {"seconds": 30}, 60)
    time.sleep(0.3)
    assert fut.cancel() or fut.cancelled()
    assert host.call("t", "add", {"a": 1, "b": 2}, 10).result(10).text == "3"


def test_server_that_exits_shows_stderr_and_restarts(host, server):
    result = host.call("t", "crash", {}, 10).result(10)
    assert result.is_error
    assert "the test server crashed on purpose" in result.text
    state = wait_for(host, "t", "error", timeout=10)
    assert state.error.endswith("fatal: the test server crashed on purpose")
    assert "not running" in host.call("t", "add", {"a": 1, "b": 1}, 10).result(10).text
    host.restart("t")
    wait_for(host, "t", "ready")
    assert host.call("t", "add", {"a": 1, "b": 1}, 10).result(10).text == "2"


def test_missing_command_is_one_line(host):
    host.configure({"nope": ServerSpec("nope", command="/nonexistent/mcp-server")})
    state = wait_for(host, "nope", "error")
    assert "\n" not in state.error and "not found" in state.error


def test_builtin_runs_without_servers(host):
    result = host.call("python", "python_doc", {"name": "os.path.join"}, 10).result(10)
    assert not result.is_error and result.text.startswith("os.path.join(")


def test_stop_ends_the_process(host):
    tag = "stop-test-marker"
    host.configure({"s": ServerSpec("s", command=sys.executable, args=(str(SCRIPT), tag))})
    assert wait_for(host, "s", "ready", "error").status == "ready"

    def mine() -> list[str]:
        out = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
        return [p for p in out.split() if _child_of_us(p)]
    assert mine()
    host.configure({})
    deadline = time.monotonic() + 10
    while mine() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mine(), "the server process is still running"


def _child_of_us(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[3] == str(os.getpid())
    except OSError:
        return False


def test_streamable_http_server(host):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        spec = parse_server("web", {"url": f"http://127.0.0.1:{port}/mcp",
                                    "headers": {"X-Client": "mtpchat-test"}})
        host.configure({"web": spec})
        state = wait_for(host, "web", "ready", "error")
        assert state.status == "ready", state.error
        assert host.call("web", "add", {"a": 20, "b": 22}, 10).result(10).text == "42"
        assert host.call("web", "fail", {"message": "x"}, 10).result(10).is_error
        sent = host.call("web", "header", {"name": "X-Client"}, 10).result(10)
        assert sent.text == "mtpchat-test", sent
    finally:
        host.configure({})
        proc.terminate()
        proc.wait(10)


def _npx_ready() -> str | None:
    if shutil.which("npx") is None:
        return "npx is not installed"
    try:
        out = subprocess.run(["npm", "view", "@modelcontextprotocol/server-filesystem", "version"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npm is unreachable: {exc}"
    return None if out.returncode == 0 else f"npm is unreachable: {out.stderr.strip()[:200]}"


def test_filesystem_server_from_npm_sees_only_the_chosen_folder(host, tmp_path):
    why = _npx_ready()
    if why:
        pytest.skip(why)
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    (chosen / "note.txt").write_text("hello from the chosen folder")
    (tmp_path / "secret.txt").write_text("top secret 1234")
    entry = filesystem_server([str(chosen)])
    assert entry["args"][-1] == str(chosen.resolve())
    host.configure({"fs": parse_server("fs", entry)})
    state = wait_for(host, "fs", "ready", "error", timeout=180)
    assert state.status == "ready", state.error
    assert "read_text_file" in [t.name for t in state.tools] or \
        "read_file" in [t.name for t in state.tools]
    tool = "read_text_file" if "read_text_file" in [t.name for t in state.tools] else "read_file"
    ok = host.call("fs", tool, {"path": str(chosen / "note.txt")}, 30).result(40)
    assert not ok.is_error and "hello from the chosen folder" in ok.text
    denied = host.call("fs", tool, {"path": str(tmp_path / "secret.txt")}, 30).result(40)
    assert denied.is_error and "top secret" not in denied.text
    listing = host.call("fs", "list_allowed_directories", {}, 30).result(40)
    assert str(chosen.resolve()) in listing.text and str(tmp_path / "secret.txt") not in listing.text
