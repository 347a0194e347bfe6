"""The scheduler hosted by another thread (the app's worker): wake per request, FIFO across
clients, render-on-start, model swap, per-client count/cancel/drain/queue limit, observers,
and a shared ``Server`` that drains only its own requests. No Qt."""
from __future__ import annotations

import threading

import httpx
import pytest

from engine.core.scheduler import (
    Done, Failed, GenRequest, QueueFull, Scheduler, SchedulerClosed, Started)
from engine.server.runner import Server
from engine.types import Event
from tests.server.fakes import ScriptedModel

pytestmark = pytest.mark.timeout(60)


class Collect:
    def __init__(self) -> None:
        self.items: list = []

    def __call__(self, item) -> None:
        self.items.append(item)

    @property
    def text(self) -> str:
        return "".join(i.text for i in self.items if isinstance(i, Event))

    @property
    def end(self):
        return self.items[-1]


def hosted(model=None, **kw) -> tuple[Scheduler, list[int]]:
    wakes: list[int] = []
    s = Scheduler.hosted(lambda: wakes.append(1), **kw)
    if model is not None:
        s.set_model(model)
    return s, wakes


def req(rid: str, client: str = "server", **kw) -> GenRequest:
    return GenRequest(id=rid, prompt_ids=(1, 2, 3), max_tokens=50, client=client, **kw)


def test_hosted_runs_on_the_callers_thread_in_fifo_order_across_clients():
    model = ScriptedModel()
    model.replies[:] = ["first", "second", "third"]
    s, wakes = hosted(model)
    sinks = [Collect() for _ in range(3)]
    s.submit(req("a"), sinks[0])
    s.submit(req("b", client="chat"), sinks[1])
    s.submit(req("c"), sinks[2])
    assert len(wakes) == 3 and s.busy == 3
    assert s.count("server") == 2 and s.count("chat") == 1
    # one run_next runs the decoder until it is empty: the requests queued meanwhile join it
    # in FIFO order (one at a time here, max_streams=1)
    assert [s.run_next() for _ in range(2)] == [True, False]
    assert [k.text for k in sinks] == ["first", "second", "third"]
    assert all(isinstance(k.items[0], Started) and isinstance(k.end, Done) for k in sinks)
    assert s.busy == 0


def test_render_runs_at_start_with_the_model_then_loaded():
    old, new = ScriptedModel(default="old"), ScriptedModel(default="new")
    s, _ = hosted(old)
    seen = []
    chat, server = Collect(), Collect()
    s.submit(req("chat", client="chat", render=lambda m: seen.append(m) or [5, 6]), chat)
    s.submit(req("srv"), server)  # rendered for the old model already
    s.set_model(new)
    s.run_next()
    s.run_next()
    assert seen == [new] and chat.text == "new"
    # the pre-rendered request was cancelled by the swap: it ends without running
    assert server.text == "" and isinstance(server.end, Done)
    assert server.end.summary.finish_reason == "cancelled" and len(new.calls) == 1


def test_no_model_fails_readably_and_the_host_goes_on():
    s, _ = hosted()
    sink = Collect()
    s.submit(req("x", render=lambda m: [1]), sink)
    s.set_model(None)
    s.run_next()
    assert isinstance(sink.end, Failed) and str(sink.end.error) == "No model is loaded yet."
    with pytest.raises(SchedulerClosed):
        s.with_tokenizer(lambda m: None)


def test_queue_limit_and_cancel_and_drain_are_per_client():
    s, _ = hosted(ScriptedModel(), max_queue=1)
    srv, chat = Collect(), Collect()
    s.submit(req("s1"), srv)
    with pytest.raises(QueueFull):
        s.submit(req("s2"), Collect())
    s.submit(req("c1", client="chat"), chat)  # the chat has its own room
    s.drain(0, client="server")
    s.run_next()
    s.run_next()
    s.submit(req("c2", client="chat"), Collect())  # still open to the chat
    s.run_next()
    assert srv.end.summary.finish_reason == "cancelled"
    assert chat.text == "Hello from the fake." and chat.end.summary.finish_reason == "stop"
    left = Collect()
    s.submit(req("c3", client="chat"), left)
    s.stop()
    with pytest.raises(SchedulerClosed):
        s.submit(req("c4", client="chat"), Collect())
    assert s.run_next() and not s.run_next()  # the leftover ends cancelled; nothing hangs
    assert left.end.summary.finish_reason == "cancelled"


def test_observers_see_every_item_of_every_request():
    s, _ = hosted(ScriptedModel())
    seen: list[tuple[str, type]] = []
    s.add_observer(lambda r, item: seen.append((r.id, type(item))))
    sink = Collect()
    s.submit(req("o"), sink)
    s.run_next()
    assert [t for _, t in seen] == [type(i) for i in sink.items]
    assert {rid for rid, _ in seen} == {"o"}


def test_shared_server_drains_its_own_requests_and_leaves_the_scheduler_open():
    model = ScriptedModel(default="x" * 400, seconds_per_cycle=0.01)
    s, _ = hosted(model)
    stop = threading.Event()

    def host() -> None:  # the app's worker thread, in miniature
        while not stop.is_set():
            if not s.run_next():
                stop.wait(0.005)
    t = threading.Thread(target=host)
    t.start()
    server = Server(s, port=0, shared=True).start()
    try:
        got: dict = {}

        def stream() -> None:
            with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                              json={"prompt": "hi", "stream": True, "max_tokens": 400}) as r:
                got["lines"] = [ln for ln in r.iter_lines() if ln]
        c = threading.Thread(target=stream)
        c.start()
        model.started.wait(10)
        server.stop(drain_s=0)
        c.join(30)
        # The stream ended with its final event: a cut reply says so (not "stop", no [DONE]).
        assert got["lines"][-1].startswith('data: {"error"') and '"cancelled"' in got["lines"][-1]
        chat = Collect()
        s.submit(req("after", client="chat"), chat)  # the chat goes on
        for _ in range(500):
            if chat.items and isinstance(chat.end, Done):
                break
            stop.wait(0.01)
        assert isinstance(chat.end, Done)
    finally:
        stop.set()
        t.join(10)
