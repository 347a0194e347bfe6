"""The worker thread over the scripted fake engine: signal order, cancel, errors, shutdown."""
from __future__ import annotations

import time

import pytest

from app.fake.engine import FakeModel
from app.worker import GenerationRequest
from engine.errors import GenerationError, ModelLoadError
from engine.types import CycleStats, PrefillStats
from tests.app.chat_fixtures import Relay, start_worker

pytestmark = pytest.mark.gui


@pytest.fixture
def env(qtbot):
    wt, fake = start_worker()
    relay = Relay(wt.worker)
    yield wt.worker, fake, relay
    assert wt.shutdown(timeout_ms=10_000)


def _load(qtbot, worker, relay, path="m"):
    with qtbot.waitSignals([relay.loading, relay.loaded], order="strict", timeout=5000):
        worker.load_model(path)


def _req(rid: int, **kw) -> GenerationRequest:
    return GenerationRequest(request_id=rid, messages=({"role": "user", "content": "hi"},), **kw)


def test_load_emits_loading_then_loaded(qtbot, env):
    worker, _fake, relay = env
    _load(qtbot, worker, relay, "some/path")
    info = relay.log[-1][1]
    assert info.path == "some/path" and info.has_mtp
    assert worker.model_info is info


def test_load_error_message_is_passed_verbatim(qtbot):
    def loader(path):
        raise ModelLoadError(f"config.json is missing in {path}")

    from app.worker import WorkerThread

    wt = WorkerThread(loader=loader)
    relay = Relay(wt.worker)
    try:
        with qtbot.waitSignal(relay.load_failed, timeout=5000) as blocker:
            wt.worker.load_model("/nowhere")
        assert blocker.args == ["config.json is missing in /nowhere"]
        assert "loaded" not in relay.names()
    finally:
        assert wt.shutdown()


def test_failed_load_reloads_the_previous_model(qtbot):
    from app.fake.engine import make_fake_loader
    from app.worker import WorkerThread

    good = make_fake_loader(FakeModel())
    broken_too = []

    def loader(path):
        if path == "bad" or (path == "m" and broken_too):
            raise ModelLoadError(f"cannot load {path}")
        return good(path)

    wt = WorkerThread(loader=loader)
    relay = Relay(wt.worker)
    try:
        _load(qtbot, wt.worker, relay, "m")
        with qtbot.waitSignal(relay.load_failed, timeout=5000) as blocker:
            wt.worker.load_model("bad")
        assert blocker.args == ["cannot load bad"]
        assert wt.worker.model_info.path == "m" and "unloaded" not in relay.names()
        broken_too.append(True)  # now the previous model cannot come back either
        with qtbot.waitSignals([relay.unloaded, relay.load_failed], order="strict", timeout=5000):
            wt.worker.load_model("bad")
        assert wt.worker.model_info is None
    finally:
        assert wt.shutdown()


def test_generate_signal_order_is_strict(qtbot, env):
    worker, fake, relay = env
    fake.script = "Hi"  # one token -> prefill stats, one cycle, finished
    _load(qtbot, worker, relay)
    checks = [
        lambda rid, obj: rid == 7 and isinstance(obj, PrefillStats),
        lambda rid, text, ids, flags: rid == 7 and text == "Hi" and len(ids) == 1 and len(flags) == 1,
        lambda rid, obj: rid == 7 and isinstance(obj, CycleStats) and obj.emitted == (100,),
        lambda rid, reason, summary: rid == 7 and reason == "stop" and summary.tokens == 1,
    ]
    with qtbot.waitSignals([relay.stats, relay.delta, relay.stats, relay.finished],
                           order="strict", check_params_cbs=checks, timeout=5000):
        worker.submit(_req(7, max_tokens=16, depth=2))
    assert fake.calls[-1]["depth"] == 2 and fake.calls[-1]["max_tokens"] == 16


def test_full_reply_streams_every_token_then_finishes(qtbot, env):
    worker, fake, relay = env
    _load(qtbot, worker, relay)
    with qtbot.waitSignal(relay.finished, timeout=5000) as blocker:
        worker.submit(_req(1, max_tokens=10_000, depth="auto"))
    text = "".join(e[2] for e in relay.log if e[0] == "delta")
    assert text == fake.script
    _rid, reason, summary = blocker.args
    assert reason == "stop"
    cycles = [e[2] for e in relay.log if e[0] == "stats" and isinstance(e[2], CycleStats)]
    assert summary.cycles == len(cycles) > 0
    assert summary.tokens == sum(len(c.emitted) for c in cycles)
    assert summary.tokens_per_cycle > 1.0  # the fake accepts drafts at depth 3
    assert "failed" not in relay.names()


def test_max_tokens_gives_length(qtbot, env):
    worker, _fake, relay = env
    _load(qtbot, worker, relay)
    with qtbot.waitSignal(relay.finished, timeout=5000) as blocker:
        worker.submit(_req(2, max_tokens=5, depth=0))
    assert blocker.args[1] == "length"
    assert blocker.args[2].tokens == 5


def test_stop_mid_stream_finishes_cancelled(qtbot, env):
    worker, fake, relay = env
    fake.tokens_per_second = 100
    fake.repeat_to = 2000
    _load(qtbot, worker, relay)
    with qtbot.waitSignal(relay.delta, timeout=5000):
        worker.submit(_req(3, max_tokens=5000))
    t0 = time.monotonic()
    with qtbot.waitSignal(relay.finished, timeout=5000) as blocker:
        worker.cancel(3)
    assert blocker.args[1] == "cancelled"
    assert time.monotonic() - t0 < 2.0
    assert blocker.args[2].tokens < 2000


def test_cancel_before_start_finishes_cancelled_without_tokens(qtbot, env):
    worker, fake, relay = env
    _load(qtbot, worker, relay)
    fake.prefill_seconds = 0.3  # keep request 4 busy while 5 waits in the queue
    with qtbot.waitSignals([relay.finished, relay.finished], timeout=5000):
        worker.submit(_req(4, max_tokens=3))
        worker.submit(_req(5, max_tokens=3))
        worker.cancel(5)
    finished = {e[1]: e for e in relay.log if e[0] == "finished"}
    assert finished[5][2] == "cancelled" and finished[5][3].tokens == 0
    assert not [e for e in relay.log if e[0] == "delta" and e[1] == 5]


@pytest.mark.parametrize("error, expected", [
    (RuntimeError("boom"), "Internal error: RuntimeError: boom"),
    (GenerationError("The prompt does not fit."), "The prompt does not fit."),
])
def test_engine_exception_becomes_failed_and_worker_survives(qtbot, env, error, expected):
    worker, fake, relay = env
    _load(qtbot, worker, relay)
    fake.fail_after, fake.error = 6, error
    with qtbot.waitSignal(relay.failed, timeout=5000) as blocker:
        worker.submit(_req(8))
    assert blocker.args == [8, expected]
    assert not [e for e in relay.log if e[0] == "finished" and e[1] == 8]
    fake.fail_after = None
    with qtbot.waitSignal(relay.finished, timeout=5000):
        worker.submit(_req(9))


def test_generate_without_model_fails_readably(qtbot, env):
    worker, _fake, relay = env
    with qtbot.waitSignal(relay.failed, timeout=5000) as blocker:
        worker.submit(_req(10))
    assert blocker.args == [10, "No model is loaded yet."]


def test_template_opened_think_block_is_shown(qtbot, env):
    worker, fake, relay = env

    class Tok:
        def decode(self, ids):
            return "<|im_start|>assistant\n<think>\n"

    _load(qtbot, worker, relay)
    fake.tokenizer = Tok()
    fake.script = "reasoning</think>\n\nanswer"
    with qtbot.waitSignal(relay.finished, timeout=5000) as blocker:
        worker.submit(_req(11))
    deltas = [e[2] for e in relay.log if e[0] == "delta"]
    assert deltas[0] == "<think>\n"
    assert blocker.args[2].finish_reason == "stop"  # (the prefilled "<think>" is no token)


def test_tune_reports_progress_then_result(qtbot, env, monkeypatch):
    worker, _fake, relay = env
    from engine.depth import tuner

    def fake_tune(model, *, depths, progress, cancel):
        assert depths == tuner.DEPTHS  # the same depths as `engine tune` (one tuner)
        for i in range(3):
            progress(i + 1, 3, f"step {i + 1}")
        return {"best_depth": 2, "model": model.info.name}

    monkeypatch.setattr(tuner, "tune", fake_tune)
    _load(qtbot, worker, relay)
    with qtbot.waitSignals([relay.tune_progress] * 3 + [relay.tune_finished], order="strict",
                           timeout=5000):
        worker.start_tune("")
    assert relay.log[-1][1] == {"best_depth": 2, "model": "fake-mtp-model"}


def test_tune_error_becomes_tune_failed(qtbot, env, monkeypatch):
    worker, _fake, relay = env
    from engine.depth import tuner

    def broken(model, *, depths, progress, cancel):
        raise GenerationError("This model has no MTP head.")

    monkeypatch.setattr(tuner, "tune", broken)
    _load(qtbot, worker, relay)
    with qtbot.waitSignal(relay.tune_failed, timeout=5000) as blocker:
        worker.start_tune("")
    assert blocker.args == ["This model has no MTP head."]


def test_shutdown_mid_generation_is_prompt_and_clean(qtbot):
    wt, fake = start_worker(FakeModel(tokens_per_second=50, repeat_to=5000))
    relay = Relay(wt.worker)
    with qtbot.waitSignal(relay.loaded, timeout=5000):
        wt.worker.load_model("m")
    with qtbot.waitSignal(relay.delta, timeout=5000):
        wt.worker.submit(_req(12, max_tokens=5000))
    t0 = time.monotonic()
    assert wt.shutdown(timeout_ms=5000)
    assert time.monotonic() - t0 < 2.0
    assert not wt.thread.isRunning()


def test_chat_and_other_clients_share_the_scheduler_in_order(qtbot, env):
    """A server request submitted to the worker's scheduler runs on the worker thread between
    chat replies, in FIFO order; it reaches ``server_*`` signals (negative ids), never the
    chat's."""
    from PySide6.QtCore import QObject, Slot

    from engine.core.scheduler import Done, GenRequest

    class Dash(QObject):
        def __init__(self):
            super().__init__()
            self.stats, self.finished = [], []

        @Slot(int, object)
        def on_stats(self, rid, obj): self.stats.append(rid)  # noqa: E704

        @Slot(int, str, object)
        def on_finished(self, rid, reason, summary): self.finished.append((rid, reason))  # noqa: E704

    worker, fake, relay = env
    dash = Dash()
    worker.server_stats.connect(dash.on_stats)
    worker.server_finished.connect(dash.on_finished)
    _load(qtbot, worker, relay)
    fake.prefill_seconds = 0.1
    ended = []
    with qtbot.waitSignals([relay.finished, relay.finished], timeout=5000):
        worker.submit(_req(20, max_tokens=4))
        worker.scheduler.submit(GenRequest(id="srv-1", prompt_ids=(1, 2), max_tokens=3),
                                lambda item: ended.append(item) if isinstance(item, Done) else None)
        worker.submit(_req(21, max_tokens=4))
    qtbot.waitUntil(lambda: bool(dash.finished), timeout=5000)
    assert [c["max_tokens"] for c in fake.calls] == [4, 3, 4]  # FIFO across clients
    assert ended and ended[0].summary.tokens == 3
    assert dash.finished == [(-1, "length")] and set(dash.stats) == {-1}
    assert {e[1] for e in relay.log if e[0] in ("stats", "delta", "finished")} == {20, 21}


def test_cancel_of_a_queued_chat_reply_behind_a_server_request(qtbot, env):
    from engine.core.scheduler import GenRequest

    worker, fake, relay = env
    _load(qtbot, worker, relay)
    fake.prefill_seconds = 0.3
    with qtbot.waitSignal(relay.finished, timeout=5000) as blocker:
        worker.scheduler.submit(GenRequest(id="srv", prompt_ids=(1,), max_tokens=2),
                                lambda item: None)
        worker.submit(_req(22))
        worker.cancel(22)
    assert blocker.args[0] == 22 and blocker.args[1] == "cancelled"
    assert len(fake.calls) == 1  # the cancelled reply never reached the model
