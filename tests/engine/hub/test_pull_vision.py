"""``pull --convert`` of a multimodal Qwen3.5 repo keeps its vision encoder: the streaming
converter quantizes the trunk and passes ``model.visual.*`` through, so the installed model
reads images (fake Hub, a real HTTP server, serving the tests' tiny vision checkpoint)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

import engine  # noqa: E402
from engine.hub.store import Store  # noqa: E402
from engine.hub.stream_convert import StreamingConvertPull  # noqa: E402
from tests.fakehub import FakeHub, FakeRepo, point_hf_at  # noqa: E402
from tests.tinyvision import build_tiny_vision_model, sample_image  # noqa: E402


def test_the_streaming_pull_keeps_the_vision_encoder(tmp_path, monkeypatch):
    from engine.vision.image_io import from_pixels

    raw = build_tiny_vision_model(tmp_path / "raw")
    files = {p.name: p.read_bytes() for p in sorted(raw.iterdir()) if p.is_file()}
    with FakeHub({"tiny/vision": FakeRepo(files)}) as hub:
        point_hf_at(hub, monkeypatch, tmp_path)
        res = StreamingConvertPull("tiny/vision", bits=4, group_size=32,
                                   store=Store(tmp_path / "store")).run()
    model = engine.load(res.path)
    assert model.info.vision and model.vision is not None
    assert model.info.quantization.get("bits") == 4 and model.info.has_mtp
    reference = engine.load(raw)
    image = from_pixels(sample_image(50, 70, seed=0))
    msgs = [{"role": "user", "content": [{"type": "image", "image": image},
                                         {"type": "text", "text": "What is this?"}]}]
    prompt = model.chat_prompt(msgs)
    assert len(prompt.images) == 1 and list(prompt) == list(reference.chat_prompt(msgs))

    def greedy(m, depth):
        return [t for ev in m.generate(prompt, max_tokens=12, depth=depth) for t in ev.token_ids]

    assert greedy(model, 3) == greedy(model, 0)
