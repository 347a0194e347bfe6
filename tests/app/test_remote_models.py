"""Models served elsewhere (issue 34, item 3), end to end: a real ``engine serve`` process of
the demo model and a real non-MTP OpenAI-compatible server (``tests.app.fake_openai``) on
127.0.0.1, added through the "Connect to a server" dialog of the real chat window; replies
stream into the chat through ``app.remote.source``, their figures reach the dashboard."""
from __future__ import annotations

import json
import os
import stat

import pytest
from openai import OpenAI

from app.chat.settings import ChatSettings
from app.fake.engine import FakeModel
from app.remote.connections import ConnectionStore, is_remote, probe
from tests.app.chat_fixtures import make_window, send
from tests.app.remote_servers import PlainServer, free_port
from tests.server.conftest import start_serve

KEY = "sk-test-remote-1234"


@pytest.fixture(scope="module")
def mtp_server(tmp_path_factory):
    """The demo model behind ``engine serve --api-key``."""
    server = start_serve(tmp_path_factory.mktemp("serve-home"), "--api-key", KEY,
                         "--max-queue", "8")
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(10)
    server.close()


@pytest.fixture
def win(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=20000))
    yield w
    w.close()


def connect(qtbot, w, url: str, key: str = ""):
    """Fill in the dialog, test, save: the connection's first model becomes the chat's."""
    d = w.remote.open_connect()
    d.url.setText(url)
    d.key.setText(key)
    d.test_button.click()
    qtbot.waitUntil(lambda: d.test_button.isEnabled(), timeout=15000)
    return d


def greedy(w, max_tokens: int = 40) -> None:
    conv = w.current_conv
    w.conversations.set_settings(conv, ChatSettings(temperature=0.0, top_p=1.0, top_k=0,
                                                    max_tokens=max_tokens, depth=2))


def last_reply(w):
    return [m for m in w.conversations.messages(w.current_conv) if m.role == "assistant"][-1]


def test_mtp_server_reply_streams_into_the_chat_and_feeds_the_dashboard(qtbot, win, mtp_server):
    d = connect(qtbot, win, mtp_server.url, KEY)
    assert d.status.text().startswith("✓") and "MTP Chat server" in d.status.text()
    assert d.key.echoMode() == d.key.EchoMode.Password  # masked
    d.save_button.click()
    qtbot.waitUntil(lambda: win.model.info is not None and is_remote(win.model.info.path))
    host = mtp_server.url.split("//")[1]
    assert win.picker.badge.text() == f"remote · {host} · MTP"
    labels = [win.picker.combo.itemText(i) for i in range(win.picker.combo.count())]
    assert f"{mtp_server.model} — {host} (remote)" in labels
    saved = ConnectionStore().path
    assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600  # the key is a secret
    assert KEY not in repr(ConnectionStore().load())

    greedy(win)
    send(qtbot, win, "What does the os module do?", timeout=60000)
    msg = last_reply(win)
    assert msg.meta["status"] == "done", msg.meta
    # the same request through the official client: the same greedy text, token for token
    client = OpenAI(base_url=mtp_server.url + "/v1", api_key=KEY)
    ref = client.chat.completions.create(
        model=mtp_server.model, messages=[{"role": "user", "content": "What does the os module do?"}],
        temperature=0, top_p=1, max_tokens=40, extra_body={"mtp": {"depth": 2},
                                                     "chat_template_kwargs": {"enable_thinking": False}})
    assert msg.content == ref.choices[0].message.content
    stats = msg.meta["stats"]
    assert stats["tokens"] == ref.usage.completion_tokens
    assert stats["cycles"] == ref.model_extra["mtp"]["cycles"] > 0

    dash = win.aux.show_dashboard()
    qtbot.waitUntil(lambda: dash.record.last_summary is not None, timeout=5000)  # queued
    summary = dash.record.last_summary
    mtp = ref.model_extra["mtp"]
    assert summary.drafted == mtp["drafted"] and summary.accepted == mtp["accepted"]
    assert [(p.drafted, p.reached, p.accepted) for p in summary.positions] == list(zip(
        mtp["drafted_by_position"], mtp["reached_by_position"], mtp["accepted_by_position"]))
    assert [round(p.rate, 4) for p in summary.positions] == mtp["acceptance_by_position"]
    dash.refresh()
    assert "(MTP Chat)" in dash.remote.text() and "tok/s" in dash.remote.text()
    assert "acceptance" in dash.remote.text() or "no drafts" in dash.remote.text()
    # the tuner and the exactness check measure the engine here, not the server's
    assert not dash.tune_button.isEnabled() and not dash.verify_button.isEnabled()
    assert host in dash.tune_button.toolTip()


def test_rates_alone_still_give_the_servers_rates():
    """A server that sends the rates but not the counts (an older MTP Chat)."""
    from app.remote.reply import summary_from_mtp

    s = summary_from_mtp({"completion_tokens": 10, "tokens_per_s": 20.0, "cycles": 4,
                          "drafted": 8, "accepted": 5, "acceptance_by_position": [0.875, 0.3333],
                          "ttft_s": 0.1}, "stop")
    assert [p.rate for p in s.positions] == [0.875, 0.3333]
    assert s.draft_acceptance == 5 / 8 and s.decode_s == 9 / 20.0 and s.tokens_per_cycle == 9 / 4


def test_a_wrong_or_missing_key_is_one_line(qtbot, win, mtp_server):
    d = connect(qtbot, win, mtp_server.url, "sk-wrong")
    assert "refused the API key (401)" in d.status.text() and "\n" not in d.status.text()
    assert not d.save_button.isEnabled()
    d = connect(qtbot, win, mtp_server.url, "")
    assert "needs an API key (401)" in d.status.text()


def test_refused_and_not_openai_are_one_line(mtp_server, caplog):
    import logging

    from app.remote.connections import RemoteError

    with caplog.at_level(logging.DEBUG):
        assert probe(mtp_server.url, KEY).kind == "mtp"
    assert KEY not in caplog.text  # never logged, even at debug level

    with pytest.raises(RemoteError, match="Connection refused by 127.0.0.1"):
        probe(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RemoteError, match="not an OpenAI-compatible server"):
        probe(mtp_server.url + "/health/x", KEY)  # answers 404 for .../v1/models
    with pytest.raises(RemoteError, match="^TLS error talking to 127.0.0.1"):
        probe(mtp_server.url.replace("http://", "https://"), KEY)  # https to a plain http port


def test_a_server_that_never_answers_is_a_timeout():
    import socket

    from app.remote.connections import RemoteError

    with socket.socket() as s:  # listens (connections queue) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        with pytest.raises(RemoteError, match=r"No answer from 127.0.0.1:\d+ within 1 s \(timeout\)"):
            probe(f"http://127.0.0.1:{s.getsockname()[1]}", timeout=1.0)


def test_plain_openai_server_gives_tok_s_only(qtbot, win):
    server = PlainServer(words=12)
    try:
        d = connect(qtbot, win, server.url)
        assert "OpenAI-compatible server" in d.status.text()
        d.save_button.click()
        qtbot.waitUntil(lambda: win.model.info is not None and is_remote(win.model.info.path))
        assert "MTP" not in win.picker.badge.text()
        send(qtbot, win, "hello", timeout=20000)
        msg = last_reply(win)
        assert msg.meta["status"] == "done"
        assert msg.content == "".join(f"word{i} " for i in range(12))
        dash = win.aux.show_dashboard()
        # the source's finished signal reaches the chat and the dashboard as two queued calls
        # (it is emitted on the source's thread): the chat can see it first
        qtbot.waitUntil(lambda: dash.record.last_summary is not None, timeout=5000)
        s = dash.record.last_summary
        assert s.tokens == 12 and s.cycles == 0 and s.tokens_per_s > 0
        dash.refresh()
        assert "MTP stats are not available for this server" in dash.remote.text()
    finally:
        server.kill()


def test_server_killed_mid_reply_keeps_the_partial_text_and_retry_works(qtbot, win):
    server = PlainServer(words=400, delay=0.05)
    port = server.port
    try:
        connect(qtbot, win, server.url).save_button.click()
        qtbot.waitUntil(lambda: win.model.info is not None and is_remote(win.model.info.path))
        send(qtbot, win, "a long one", wait=False)
        qtbot.waitUntil(lambda: "word3 " in (win.session.active_stream() or
                                              type("S", (), {"content": ""})).content,
                        timeout=20000)
        server.kill()
        qtbot.waitUntil(lambda: not win.session.streams, timeout=5000)
        msg = last_reply(win)
        assert msg.meta["status"] == "error"
        assert msg.content.startswith("word0 word1 word2 word3 ")
        assert "\n" not in msg.meta["error"] and "127.0.0.1" in msg.meta["error"]
        server = PlainServer(port, words=5)
        win.session.regenerate(win.current_conv, msg.id)
        qtbot.waitUntil(lambda: not win.session.streams, timeout=20000)
        assert last_reply(win).content == "word0 word1 word2 word3 word4 "
    finally:
        server.kill()


def test_stop_closes_the_http_stream_at_once(qtbot, win):
    server = PlainServer(words=400, delay=0.05)
    try:
        connect(qtbot, win, server.url).save_button.click()
        qtbot.waitUntil(lambda: win.model.info is not None and is_remote(win.model.info.path))
        send(qtbot, win, "go on", wait=False)
        qtbot.waitUntil(lambda: win.session.active_stream() is not None
                        and "word2" in win.session.active_stream().content, timeout=20000)
        win.session.stop()
        qtbot.waitUntil(lambda: not win.session.streams, timeout=5000)
        qtbot.waitUntil(lambda: any(line.startswith("closed ") for line in server.lines),
                        timeout=5000)
        closed = int(next(x for x in server.lines if x.startswith("closed ")).split()[1])
        assert closed < 400  # the server stopped sending: the client went away
        msg = last_reply(win)
        assert msg.meta["status"] == "cancelled" and msg.content.startswith("word0 word1 word2 ")
        assert msg.meta["stats"]["tokens"] >= 3  # what streamed until Stop
    finally:
        server.kill()


def test_removed_connection_leaves_the_picker(qtbot, win):
    server = PlainServer()
    try:
        connect(qtbot, win, server.url).save_button.click()
        qtbot.waitUntil(lambda: win.model.info is not None and is_remote(win.model.info.path))
        models = win.aux.show_models()
        panel = models.servers_panel
        panel.refresh()
        assert panel.table.rowCount() == 1 and panel.table.item(0, 3).text() == "none"
        panel.table.selectRow(0)
        panel.remove_selected()
        assert ConnectionStore().load() == []
        labels = [win.picker.combo.itemText(i) for i in range(win.picker.combo.count())]
        assert not any("(remote)" in t and "plain-model" in t for t in labels
                       if t != win.picker.combo.currentText())
    finally:
        server.kill()


def test_cluster_dialog_writes_a_hostfile_the_launcher_accepts(qtbot, tmp_path):
    from app.remote.cluster_dialog import ClusterDialog
    from engine.distributed.launch import launch_command, read_hostfile

    d = ClusterDialog(hostfile=tmp_path / "hosts.json")
    qtbot.addWidget(d)
    d.set_hosts([("mac1", "10.0.0.1"), ("mac2", "10.0.0.2")])
    d.pipeline.setChecked(True)
    d.key.setText("sk-cluster")
    assert d.write()
    hosts, backend = read_hostfile(tmp_path / "hosts.json")
    assert backend == "ring" and [h["ssh"] for h in hosts] == ["mac1", "mac2"]
    assert hosts[1]["ips"] == ["10.0.0.2"]
    cmd = launch_command(["serve"], str(tmp_path / "hosts.json"), backend=None)
    assert "--hostfile" in cmd and "ring" in cmd
    shown = d.command.toPlainText()
    assert "--hostfile" in shown and "--pipeline" in shown and "sk-cluster" not in shown
    assert d.plan().command(d.written)[-1] == "sk-cluster"  # the copied command has the key
    assert not d.start_button.isEnabled()  # rank 0 is another machine: run it there

    before = (tmp_path / "hosts.json").read_text()
    d.set_hosts([("mac1", "10.0.0.1"), ("mac2", "not-an-ip")])
    assert not d.write()
    assert d.status.text().startswith("✗") and "'not-an-ip' is not an IP address" in \
        d.status.text() and "\n" not in d.status.text()
    assert (tmp_path / "hosts.json").read_text() == before  # refused: nothing written
    d.set_hosts([("mac1", "10.0.0.1")])
    assert not d.write() and "a cluster needs at least two" in d.status.text()
    d.set_hosts([("mac1", "10.0.0.1"), ("mac2", "")])
    assert not d.write() and "needs an IP address for every host" in d.status.text()
    assert json.loads(before)["backend"] == "ring"


def test_cluster_dialog_starts_and_stops_a_process_group(qtbot, tmp_path):
    """Start over SSH runs the command here with its output live; Stop ends it. (The command
    is swapped for one that prints what ``engine serve`` prints: a real 2-rank cluster takes
    minutes to start on the test machine.)"""
    import sys

    from app.remote.cluster_dialog import ClusterDialog, ProcessOutput

    d = ClusterDialog(hostfile=tmp_path / "hosts.json")
    qtbot.addWidget(d)
    d.set_hosts([("127.0.0.1", "127.0.0.1"), ("127.0.0.1", "127.0.0.1")])
    assert d.write() and d.plan().runs_here()
    ready = []
    d.server_ready.connect(ready.append)
    script = ("import time; print('Serving demo on http://0.0.0.0:9999 (OpenAI: ...)', "
              "flush=True); time.sleep(60)")
    d.running = ProcessOutput([sys.executable, "-c", script])
    d.running.line.connect(d.on_line)
    d.running.ended.connect(d.on_ended)
    d.running.start()
    qtbot.waitUntil(lambda: bool(ready), timeout=10000)
    assert ready == ["http://127.0.0.1:9999"]
    assert "Serving demo" in d.output.toPlainText()
    d.cancel()
    qtbot.waitUntil(lambda: d.running is None, timeout=10000)
    assert d.status.text() == "The cluster stopped."


def test_a_process_that_ends_at_once_is_heard_to_the_end(qtbot):
    """The reader starts only after the signals are connected: a command that prints and
    exits at once still delivers its line and its end (a missing model, a bad flag)."""
    import sys

    from app.remote.cluster_dialog import ProcessOutput

    for _ in range(5):
        out = ProcessOutput([sys.executable, "-c", "print('bad flag'); raise SystemExit(2)"])
        lines, ended = [], []
        out.line.connect(lines.append)
        out.ended.connect(ended.append)
        out.start()
        qtbot.waitUntil(lambda: bool(ended), timeout=10000)
        assert lines == ["bad flag"] and ended == [2]


def test_a_launcher_that_cannot_run_is_named_and_the_dialog_stays_usable(qtbot, tmp_path,
                                                                           monkeypatch):
    from app.remote import cluster_dialog
    from app.remote.cluster_dialog import ClusterDialog

    def missing(self):
        raise FileNotFoundError(2, "No such file or directory", self.cmd[0])
    monkeypatch.setattr(cluster_dialog.ProcessOutput, "start", missing)
    d = ClusterDialog(hostfile=tmp_path / "hosts.json")
    qtbot.addWidget(d)
    d.set_hosts([("127.0.0.1", "127.0.0.1"), ("127.0.0.1", "127.0.0.1")])
    d.start()
    assert d.running is None
    assert d.status.text().startswith("Could not start the cluster: ")


def test_reasoning_and_tool_calls_arrive_as_the_chat_writes_them(qtbot):
    """``reasoning_content`` becomes the chat's think block; streamed ``tool_calls`` become
    the ``<tool_call>`` blocks the tool loop parses (``engine.server.toolcalls``)."""
    from app.remote.source import RemoteSource
    from app.worker import GenerationRequest
    from engine.server.toolcalls import parse_tool_calls

    server = PlainServer(words=3, think=True)
    source = RemoteSource()
    try:
        conn = probe(server.url)
        source.use(conn, conn.models[0])
        got: dict[int, list] = {1: [], 2: []}
        ended: dict[int, tuple] = {}
        source.delta.connect(lambda rid, text, _ids, _f: got[rid].append(text))
        source.finished.connect(lambda rid, reason, s: ended.__setitem__(rid, (reason, s)))
        source.submit(GenerationRequest(1, ({"role": "user", "content": "hi"},)))
        tool = {"type": "function", "function": {"name": "read_file", "parameters": {
            "type": "object", "properties": {"path": {"type": "string"}}}}}
        history = ({"role": "user", "content": "read it"},
                   {"role": "assistant", "content": "", "reasoning_content": "x",
                    "tool_calls": [{"id": "c0", "type": "function", "function": {
                        "name": "read_file", "arguments": {"path": "a"}}}]},
                   {"role": "tool", "content": "text", "tool_call_id": "c0", "name": "read_file"})
        source.submit(GenerationRequest(2, history, tools=(tool,)))
        qtbot.waitUntil(lambda: len(ended) == 2, timeout=15000)
        assert "".join(got[1]) == "<think>\nLet me think.\n</think>\n\nword0 word1 word2 "
        _, calls = parse_tool_calls("".join(got[2]), {"read_file": tool["function"]["parameters"]})
        assert [(c.name, c.arguments) for c in calls] == [("read_file", {"path": "notes.md"})]
        assert ended[2][0] == "stop"
    finally:
        source.shutdown()
        server.kill()


def test_cluster_ready_opens_a_tested_connection(qtbot, win):
    server = PlainServer()
    try:
        cluster = win.remote.open_cluster()
        cluster.server_ready.emit(server.url)  # what the dialog says once the cluster answers
        d = win.remote.dialog
        qtbot.waitUntil(lambda: d.save_button.isEnabled(), timeout=15000)
        assert d.url.text() == server.url and "plain-model" in d.status.text() or \
            d.models.item(0).text() == "plain-model"
        cluster.close()
    finally:
        server.kill()


def test_the_remote_model_is_chosen_again_at_the_next_start(qtbot, tmp_path, monkeypatch):
    from app.chat.main_window import MainWindow
    from app.fake.engine import make_fake_loader

    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    server = PlainServer()
    try:
        w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=20000))
        connect(qtbot, w, server.url).save_button.click()
        qtbot.waitUntil(lambda: w.model.info is not None and is_remote(w.model.info.path))
        path = w.model.info.path
        w.close()
        again = MainWindow(loader=make_fake_loader(FakeModel()), db_file=tmp_path / "chats.db")
        qtbot.addWidget(again)
        qtbot.waitUntil(lambda: again.model.info is not None)
        assert again.model.info.path == path
        again.close()
    finally:
        server.kill()
