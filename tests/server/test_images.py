"""Images through the server, with the official clients, against real server processes on
free loopback ports: OpenAI chat completions (``image_url`` data: URLs), /v1/responses
(``input_image``) and Anthropic messages (base64 ``image`` blocks), with and without
streaming, each reply equal to the engine's own greedy reply to the same rendered prompt;
every limit (bytes, pixels, images per request), a remote URL without
``--allow-remote-images``, a bad image and the text-only demo answer 400 in the API's shape.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from tests.server.conftest import start_serve  # noqa: E402
from tests.tinyvision import build_tiny_vision_model, sample_image  # noqa: E402

MAX_TOKENS = 10


def encoded(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    """(server, model folder, the two test images' PNG bytes)."""
    folder = build_tiny_vision_model(tmp_path_factory.mktemp("tinyvision") / "m")
    server = start_serve(tmp_path_factory.mktemp("home"), "--model", str(folder),
                         "--max-images", "2", "--max-image-pixels", "20000",
                         "--max-image-mb", "0.02", timeout=180)
    pngs = [encoded(sample_image(50, 70, 0)), encoded(sample_image(90, 40, 1))]
    assert all(len(p) < 0.02 * (1 << 20) for p in pngs)
    yield server, folder, pngs
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(10)
    server.close()


@pytest.fixture(scope="module")
def expected(vision):
    """The engine's own greedy reply (text) to one and to two images, in-process."""
    import engine
    from engine.vision.image_io import decode_image

    _, folder, pngs = vision
    m = engine.load(folder)
    out = {}
    for n, text in ((1, "What is in this image?"), (2, "Compare them.")):
        parts = [{"type": "image", "image": decode_image(p)} for p in pngs[:n]]
        prompt = m.chat_prompt([{"role": "user",
                                 "content": parts + [{"type": "text", "text": text}]}])
        out[n] = "".join(e.text for e in m.generate(prompt, max_tokens=MAX_TOKENS, depth=0))
    assert out[1] != out[2]
    return out


def oai_messages(urls: list[str], text: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def ant_messages(pngs: list[bytes], text: str) -> list[dict]:
    blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": base64.b64encode(p).decode()}}
              for p in pngs]
    return [{"role": "user", "content": blocks + [{"type": "text", "text": text}]}]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_with_images(vision, expected, stream):
    server, _, pngs = vision
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        for n, text in ((1, "What is in this image?"), (2, "Compare them.")):
            kw = dict(model=server.model, messages=oai_messages(
                [data_url(p) for p in pngs[:n]], text), max_tokens=MAX_TOKENS, temperature=0,
                extra_body={"mtp": {"depth": 2}})
            if stream:
                got = "".join(c.choices[0].delta.content or "" for c in
                              client.chat.completions.create(stream=True, **kw) if c.choices)
            else:
                got = client.chat.completions.create(**kw).choices[0].message.content
            assert got == expected[n], (n, stream)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_with_input_image(vision, expected, stream):
    server, _, pngs = vision
    item = {"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(pngs[0])},
        {"type": "input_text", "text": "What is in this image?"}]}
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        kw = dict(model=server.model, input=[item], max_output_tokens=MAX_TOKENS,
                  temperature=0)
        if stream:
            got = "".join(ev.delta for ev in client.responses.create(stream=True, **kw)
                          if ev.type == "response.output_text.delta")
        else:
            got = client.responses.create(**kw).output_text
    assert got == expected[1]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages_with_image_blocks(vision, expected, stream):
    server, _, pngs = vision
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as client:
        for n, text in ((1, "What is in this image?"), (2, "Compare them.")):
            kw = dict(model=server.model, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
                      messages=ant_messages(pngs[:n], text))
            if stream:
                with client.messages.stream(**kw) as s:
                    got = "".join(s.text_stream)
            else:
                got = "".join(b.text for b in client.messages.create(**kw).content
                              if b.type == "text")
            assert got == expected[n], (n, stream)


def refusals(pngs: list[bytes]) -> dict[str, tuple[list[str], str]]:
    """name -> (image data: URLs, what the 400 says)."""
    noise = np.random.default_rng(0).integers(0, 255, (100, 100, 3), dtype=np.uint8)
    big_bytes = encoded(noise, "BMP")          # 10 000 pixels, 30 kB > 0.02 MiB
    many_pixels = encoded(np.zeros((150, 200, 3), np.uint8))  # small file, 30 000 pixels
    return {
        "bytes": ([data_url(big_bytes, "image/bmp")], "MiB"),
        "pixels": ([data_url(many_pixels)], "pixels"),
        "count": ([data_url(p) for p in pngs + pngs[:1]], "3 images"),
        "remote": (["https://example.com/cat.png"], "--allow-remote-images"),
        "broken": ([data_url(b"this is not an image")], "image"),
        "not base64": (["data:image/png;base64,@@@@"], "base64"),
    }


def test_every_limit_and_remote_urls_are_400_in_openai_shape(vision):
    server, _, pngs = vision
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        for name, (urls, said) in refusals(pngs).items():
            with pytest.raises(openai.BadRequestError) as err:
                client.chat.completions.create(model=server.model, max_tokens=4,
                                               messages=oai_messages(urls, "Hi"))
            body = err.value.body
            assert said in body["message"] and "\n" not in body["message"], name
            assert body["type"] == "invalid_request_error", name
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model=server.model, max_output_tokens=4, input=[
                {"role": "user", "content": [
                    {"type": "input_image", "image_url": "http://127.0.0.1:1/x.png"}]}])
        assert "--allow-remote-images" in err.value.body["message"]


def test_limits_and_remote_urls_are_400_in_anthropic_shape(vision):
    server, _, pngs = vision
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(model=server.model, max_tokens=4, messages=[
                {"role": "user", "content": [{"type": "image", "source": {
                    "type": "url", "url": "https://example.com/cat.png"}}]}])
        assert err.value.body["type"] == "error"
        assert "--allow-remote-images" in err.value.body["error"]["message"]
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(model=server.model, max_tokens=4,
                                   messages=ant_messages(pngs + pngs[:1], "Hi"))
        assert "3 images" in err.value.body["error"]["message"]
    assert server.proc.poll() is None  # the server is still serving


def test_the_text_only_demo_refuses_an_image(demo_server, vision):
    _, _, pngs = vision
    with openai.OpenAI(base_url=demo_server.url + "/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=demo_server.model, max_tokens=4,
                                           messages=oai_messages([data_url(pngs[0])], "Hi"))
    assert "no vision encoder" in err.value.body["message"]
    with anthropic.Anthropic(base_url=demo_server.url, api_key="x", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(model=demo_server.model, max_tokens=4,
                                   messages=ant_messages(pngs[:1], "Hi"))
    assert "no vision encoder" in err.value.body["error"]["message"]
