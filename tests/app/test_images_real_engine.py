"""An image chat through the window, the worker and the real engine with a tiny random
Qwen3.5 vision model (``tests.tinyvision``, from the engine side of issue 32, branch
h/vision-engine): until that branch is merged this module is skipped."""
from __future__ import annotations

import io
from dataclasses import replace

import pytest
from PIL import Image

pytestmark = pytest.mark.gui
tinyvision = pytest.importorskip("tests.tinyvision", reason="needs the engine side of issue 32")


def test_image_chat_with_a_real_tiny_vision_model(qtbot, tmp_path):
    from app.chat.main_window import MainWindow

    model_dir = tinyvision.build_tiny_vision_model(tmp_path / "m")
    w = MainWindow(model_path=str(model_dir), db_file=tmp_path / "db.sqlite")
    qtbot.addWidget(w)
    w.show()
    try:
        qtbot.waitUntil(lambda: w.model.info is not None or w.banner.isVisibleTo(w),
                        timeout=300_000)
        assert w.model.info is not None, w.banner.text()
        assert w.model.info.vision
        settings = replace(w.session.settings_for(w.current_conv), max_tokens=8,
                           temperature=0.0, depth=2)
        w.store.set_conversation_settings(w.current_conv, settings.to_dict())
        buf = io.BytesIO()
        Image.fromarray(tinyvision.sample_image(50, 70, seed=0)).save(buf, "PNG")
        w.composer.attach_image("a.png", buf.getvalue())
        assert not w.composer.attach_error.isVisibleTo(w.composer), w.composer.attach_error.text()
        for text in ("What is in this image?", "And again?"):  # the second from the database
            w.composer.edit.setPlainText(text)
            w.composer.button.click()
            qtbot.waitUntil(lambda: not w.session.streams, timeout=300_000)
            reply = w.store.messages(w.current_conv)[-1]
            assert reply.meta["status"] == "done", reply.meta
            assert reply.meta["stats"]["tokens"] >= 1
    finally:
        w.close()
