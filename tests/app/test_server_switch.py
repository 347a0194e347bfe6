"""The app's "Local server" switch (issue 14, item 9): a real server on a free loopback port
serving the chat's loaded model through the worker's scheduler, so chat replies and server
requests queue together on the one thread that owns the model.

Most tests run the real window over the scripted fake engine; one runs the embedded demo
model and the official ``openai`` client."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from app.fake.engine import FakeModel
from app.server_control import ServerControl, ServerSettings
from tests.app.chat_fixtures import make_window

pytestmark = [pytest.mark.gui, pytest.mark.timeout(120)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """No server listens there: a new server (SO_REUSEADDR, as uvicorn's) could bind it.
    Closed connections left in TIME_WAIT do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def serve(qtbot, w, port: int, **kw) -> ServerControl:
    c = w.server
    c.apply(ServerSettings(enabled=True, port=port, **kw))
    qtbot.waitUntil(lambda: c.state in ("serving", "error"), timeout=10_000)
    assert c.state == "serving", c.error
    return c


def status_text(w) -> str:
    return _indicator(w).button.text()


@pytest.fixture
def window(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=400, repeat_to=120)
    w = make_window(qtbot, tmp_path, fake)
    yield w, fake
    w.close()


def _indicator(w):
    from app.server_control import ServerIndicator

    return w.statusBar().findChild(ServerIndicator)


def _chat_completion(url: str, out: dict, **body) -> None:
    try:
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "fake-mtp-model", "max_tokens": 200, "temperature": 0,
            "messages": [{"role": "user", "content": "hello"}], **body})
        out["status"], out["json"] = r.status_code, r.json()
    except Exception as exc:  # noqa: BLE001 - reported by the test's assert
        out["error"] = exc


def test_switch_serves_the_loaded_model_and_shows_it(qtbot, window):
    w, _fake = window
    port = free_port()
    c = serve(qtbot, w, port)
    assert status_text(w) == f"Serving on http://127.0.0.1:{port} · 0 requests"
    assert w.server_action.isChecked()
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "fake-mtp-model"
    out: dict = {}
    _chat_completion(c.url, out, max_tokens=20)
    assert out["status"] == 200, out
    assert out["json"]["choices"][0]["message"]["content"]
    assert out["json"]["usage"]["completion_tokens"] == 20


def test_chat_and_server_requests_interleave_and_both_complete(qtbot, window):
    w, fake = window
    c = serve(qtbot, w, free_port())
    dash = w.aux.show_dashboard()
    fake.tokens_per_second = 150  # ~0.8 s per reply: long enough to overlap
    outs = [{}, {}]
    threads = [threading.Thread(target=_chat_completion, args=(c.url, o)) for o in outs]
    for t in threads:
        t.start()
    qtbot.waitUntil(lambda: c.requests == 2, timeout=10_000)
    assert status_text(w).endswith("· 2 requests")
    w.composer.edit.setPlainText("And a chat reply meanwhile")
    w.composer.button.click()
    assert w.session.streams  # queued behind the server's requests, not refused
    qtbot.waitUntil(lambda: not w.session.streams, timeout=30_000)
    for t in threads:
        t.join(30)
    assert all(o.get("status") == 200 for o in outs), outs
    reply = w.store.messages(w.current_conv)[-1]
    assert reply.meta["status"] == "done" and reply.meta["stats"]["tokens"] == 120
    assert len(fake.calls) == 3  # one after another on the worker thread
    qtbot.waitUntil(lambda: c.requests == 0, timeout=5000)
    assert status_text(w).endswith("· 0 requests")
    # the dashboard saw the server's replies too (their cycles and their ends)
    assert dash.record.finished[0] == 3


def test_cancelled_server_stream_frees_the_model_for_the_chat(qtbot, window):
    w, fake = window
    fake.tokens_per_second, fake.repeat_to = 50, 5000
    c = serve(qtbot, w, free_port())
    with httpx.stream("POST", c.url + "/v1/chat/completions", timeout=30, json={
            "model": "x", "stream": True, "max_tokens": 5000,
            "messages": [{"role": "user", "content": "long"}]}) as r:
        next(r.iter_lines())  # streaming has begun: then the client goes away
    fake.repeat_to = 40
    t0 = time.monotonic()
    w.composer.edit.setPlainText("My turn")
    w.composer.button.click()
    qtbot.waitUntil(lambda: not w.session.streams, timeout=15_000)
    assert time.monotonic() - t0 < 5
    assert w.store.messages(w.current_conv)[-1].meta["status"] == "done"


def test_turning_the_switch_off_frees_the_port(qtbot, window):
    w, _fake = window
    port = free_port()
    c = serve(qtbot, w, port)
    assert not port_is_free(port)
    _indicator(w).button.click()  # the status-bar toggle
    assert not c.settings.enabled
    qtbot.waitUntil(lambda: c.state == "off", timeout=15_000)
    assert port_is_free(port)
    assert status_text(w) == "Local server: off"
    assert not w.server_action.isChecked()
    w.server_action.trigger()  # and on again from the menu
    qtbot.waitUntil(lambda: c.state == "serving", timeout=10_000)
    assert httpx.get(c.url + "/health", timeout=10).json()["status"] == "ok"


def test_port_in_use_gives_a_clear_message(qtbot, window):
    w, _fake = window
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        w.server.apply(ServerSettings(enabled=True, port=port))
        assert w.server.state == "error"
        msg = _indicator(w).error_label.text()
        assert msg == (f"Port {port} on 127.0.0.1 is already in use by another program. "
                       "Choose another port, or stop that program.")
        assert _indicator(w).error_label.isVisibleTo(w)
        assert status_text(w) == "Local server: failed to start"
    # the chat is unaffected
    w.composer.edit.setPlainText("still chatting")
    w.composer.button.click()
    qtbot.waitUntil(lambda: not w.session.streams, timeout=15_000)


def test_api_key_and_preference_survive_a_restart(qtbot, tmp_path):
    port = free_port()
    w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=2000))
    serve(qtbot, w, port, api_key="s3cret")
    assert httpx.get(w.server.url + "/v1/models", timeout=10).status_code == 401
    w.close()
    assert port_is_free(port)  # quitting the app stopped the server
    w2 = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=2000))
    try:
        qtbot.waitUntil(lambda: w2.server.state == "serving", timeout=10_000)
        assert w2.server.settings == ServerSettings(enabled=True, port=port, api_key="s3cret")
        r = httpx.get(w2.server.url + "/v1/models", timeout=10,
                      headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
    finally:
        w2.close()
    assert port_is_free(port)


def test_server_waits_for_a_model_then_serves_it(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, wait_loaded=False)
    try:
        port = free_port()
        w.server.set_enabled(True)
        w.server.apply(ServerSettings(enabled=True, port=port))
        qtbot.waitUntil(lambda: w.server.state == "serving", timeout=10_000)
        assert w.model.info is not None
    finally:
        w.close()


@pytest.mark.slow
def test_demo_model_served_from_the_app_to_the_openai_client(qtbot, tmp_path):
    """The embedded demo model, loaded by the app, answers the official client while the
    chat replies too; greedy server output equals in-process ``generate``."""
    import openai

    import engine
    from engine.types import SamplingParams
    from app.chat.main_window import MainWindow

    path = engine.default_model_path()
    w = MainWindow(model_path=str(path), db_file=tmp_path / "db.sqlite")
    qtbot.addWidget(w)
    w.show()
    try:
        qtbot.waitUntil(lambda: w.model.info is not None, timeout=120_000)
        c = serve(qtbot, w, free_port())
        client = openai.OpenAI(base_url=c.url + "/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "Explain str.split."}]
        out: dict = {}

        def ask() -> None:
            out["r"] = client.chat.completions.create(
                model="gpt-4o", messages=msgs, max_tokens=40,
                temperature=0, extra_body={"enable_thinking": False})
        t = threading.Thread(target=ask)
        t.start()
        w.composer.edit.setPlainText("What does `os.path.join` do?")
        w.composer.button.click()
        qtbot.waitUntil(lambda: not w.session.streams, timeout=120_000)
        t.join(120)
        client.close()
        r = out["r"]
        model = engine.load(path)
        ids = model.chat_ids(msgs, enable_thinking=False)
        ref = [ev for ev in model.generate(ids, max_tokens=40, depth="auto",
                                           sampling=SamplingParams(temperature=0.0))]
        ref_tokens = sum(len(ev.token_ids) for ev in ref)
        assert r.usage.completion_tokens == ref_tokens
        assert r.choices[0].message.content.strip() in "".join(ev.text for ev in ref)
        assert w.store.messages(w.current_conv)[-1].meta["status"] == "done"
    finally:
        w.close()


def test_loading_another_model_cancels_server_requests_then_serves_it(qtbot, window, tmp_path):
    w, fake = window
    fake.tokens_per_second, fake.repeat_to = 50, 5000
    c = serve(qtbot, w, free_port())
    out: dict = {}
    t = threading.Thread(target=_chat_completion, args=(c.url, out), kwargs={"max_tokens": 5000})
    t.start()
    qtbot.waitUntil(lambda: c.requests == 1 and bool(fake.calls), timeout=10_000)
    other = tmp_path / "other-model"
    other.mkdir()
    t0 = time.monotonic()
    w.load_model(str(other))
    qtbot.waitUntil(lambda: w.model.ready and w.model.info.path == str(other), timeout=10_000)
    assert time.monotonic() - t0 < 5  # the load did not wait for 5,000 tokens
    t.join(30)
    # the request ended, cancelled, and the client was told so (not a normal "stop")
    assert out["status"] == 503, out
    assert out["json"]["error"]["code"] == "cancelled"
    assert "model was changed" in out["json"]["error"]["message"]
    assert c.state == "serving" and c.server.backend.info.path == str(other)


def test_quitting_mid_reply_with_a_server_request_waiting_is_prompt(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=50, repeat_to=5000)
    w = make_window(qtbot, tmp_path, fake)
    port = free_port()
    c = serve(qtbot, w, port)
    w.composer.edit.setPlainText("a long reply")
    w.composer.button.click()
    out: dict = {}
    t = threading.Thread(target=_chat_completion, args=(c.url, out))
    t.start()
    qtbot.waitUntil(lambda: c.requests == 1, timeout=10_000)  # waiting behind the chat
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < 5
    t.join(20)
    assert not t.is_alive() and port_is_free(port)
