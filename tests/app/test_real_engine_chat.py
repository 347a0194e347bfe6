"""A real chat through the worker and the window with the real engine (no fake): a tiny random
Qwen3.5-architecture model with MTP heads, and the embedded demo model when it is built."""
from __future__ import annotations

import pytest

from engine.resources import default_model_path
from tests.tinymodels import build_tiny_model

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-chat") / "m", seed=5)


def _chat(qtbot, tmp_path, model_dir, *, depth, max_tokens=12, timeout=120_000):
    from dataclasses import replace

    from app.chat.main_window import MainWindow

    w = MainWindow(model_path=str(model_dir), db_file=tmp_path / "db.sqlite")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.model.info is not None or w.banner.isVisibleTo(w),
                    timeout=timeout)
    assert w.model.info is not None, w.banner.text()
    settings = replace(w.session.settings_for(w.current_conv), max_tokens=max_tokens,
                       temperature=0.0, depth=depth)
    w.store.set_conversation_settings(w.current_conv, settings.to_dict())
    w.composer.edit.setPlainText("Hello there")
    w.composer.button.click()
    stream = next(iter(w.session.streams.values()))
    qtbot.waitUntil(lambda: not w.session.streams, timeout=timeout)
    reply = w.store.messages(w.current_conv)[-1]
    return w, reply, stream


def test_tiny_model_chat_through_the_worker(qtbot, tmp_path, tiny_dir):
    w, reply, stream = _chat(qtbot, tmp_path, tiny_dir, depth=2)
    try:
        assert reply.role == "assistant" and reply.meta["status"] == "done", reply.meta
        stats = reply.meta["stats"]
        assert 1 <= stats["tokens"] <= 12 and stats["cycles"] >= 1
        assert stream.got_prefill and stream.cycles >= 1
        assert w.view.widgets[reply.id].content == reply.content
        assert w.model.info.has_mtp
    finally:
        w.close()


def test_demo_model_chat(qtbot, tmp_path):
    demo = default_model_path()
    assert (demo / "model.safetensors").is_file(), f"the embedded demo model is missing: {demo}"
    w, reply, _stream = _chat(qtbot, tmp_path, demo, depth="auto", max_tokens=24)
    try:
        assert reply.meta["status"] == "done", reply.meta
        assert reply.meta["stats"]["tokens"] >= 1
    finally:
        w.close()
