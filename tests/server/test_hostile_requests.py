"""Hostile and malformed requests against the real server (issue 27): each is answered as the
client's fault (4xx naming the field) or reported honestly (an error, never a "stop"), the
server logs no traceback for them, and it goes on serving.

Cases: schemas that admit no document or are too large (400 up front); a grammar that fails
mid-reply (an error response / a final error frame, not "stop"); a huge schema does not stall
a concurrent stream; NaN / Infinity and deep nesting; malformed Anthropic text fields; an
image in a tool_result; logprobs; a queued client that leaves; a drain cutting streams; a
model whose config names an EOS outside its vocabulary; ``generate --stop ""``.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.server.conftest import ROOT, start_serve

pytestmark = pytest.mark.timeout(180)


def _schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def _props(n: int, prefix: str = "p") -> dict:
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "string"}
                                             for i in range(n)}}


# A reply that must run for several seconds: the grammar forbids EOS for 3,000 characters.
LONG = _schema({"type": "string", "minLength": 3000})
# Passes the size checks, but after "{" llguidance's parser row outgrows its 2,000 items.
FAILS_MID_REPLY = {"anyOf": [_props(300, "a"), _props(300, "b")]}
CHAT = {"messages": [{"role": "user", "content": "What does os.path.join do?"}],
        "max_tokens": 8, "temperature": 0}
MSG = {"model": "claude-test", "max_tokens": 8,
       "messages": [{"role": "user", "content": "What does os.path.join do?"}]}
TOOL_TURN = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                                "input": {}}]}]
PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                   "data": "iVBORw0KGgo="}}


def _post(server, path: str, body, timeout: float = 60) -> httpx.Response:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=raw, timeout=timeout,
                      headers={"content-type": "application/json"})


class Log:
    """The server's stderr from now on."""

    def __init__(self, server) -> None:
        self.server, self.start = server, len(server.stderr)

    def text(self) -> str:
        time.sleep(0.3)  # let the reader thread catch up
        return "".join(self.server.stderr[self.start:])

    def assert_clean_and_serving(self) -> None:
        text = self.text()
        for bad in ("Traceback", "ERROR", "Internal server error", "Exception in ASGI"):
            assert bad not in text, text[-3000:]
        r = _post(self.server, "/v1/chat/completions", CHAT)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


@pytest.fixture()
def log(demo_server):
    watch = Log(demo_server)
    yield watch
    watch.assert_clean_and_serving()


def _sse_lines(server, path: str, body: dict, out: list, stamps: list | None = None) -> None:
    with httpx.stream("POST", server.url + path, json=body, timeout=90) as r:
        for line in r.iter_lines():
            out.append(line)
            if stamps is not None and line.startswith("data: {"):
                stamps.append(time.perf_counter())


def _data(lines: list[str]) -> list[dict]:
    return [json.loads(x[6:]) for x in lines if x.startswith("data: {")]


# ---------------------------------------------------------------------- A: structured output

@pytest.mark.parametrize("schema,says", [
    ({"$ref": "#"}, "no JSON document satisfies it"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
     "no JSON document satisfies it"),
    (_props(10_000), "10,000 optional properties"),
    ({"type": "object", "x-guidance": 5}, "x-guidance"),
    (json.loads('{"items": ' * 80 + "{}" + "}" * 80), "nested too deeply"),
], ids=["ref-self", "ref-loop", "10k-optional", "x-guidance-5", "80-deep"])
def test_unusable_schemas_are_400_up_front(demo_server, log, schema, says):
    r = _post(demo_server, "/v1/chat/completions", {**CHAT, "response_format": _schema(schema)})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert says in err["message"] and err["param"] == "response_format"
    r = _post(demo_server, "/v1/messages", {**MSG, "output_format": {
        "type": "json_schema", "schema": schema}})
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_grammar_failing_mid_reply_is_an_error_not_stop(demo_server, log):
    import openai

    body = {**CHAT, "max_tokens": 32, "response_format": _schema(FAILS_MID_REPLY)}
    r = _post(demo_server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "grammar_failed" and "max is 2000" in r.text
    r = _post(demo_server, "/v1/completions", {"prompt": "x", **{k: body[k] for k in (
        "max_tokens", "response_format")}})
    assert r.status_code == 400 and "grammar failed" in r.text
    # A stream: the openai client raises on the final error chunk; no chunk says "stop".
    with openai.OpenAI(base_url=demo_server.url + "/v1", api_key="x", max_retries=0) as oai:
        chunks = []
        with pytest.raises(openai.APIError, match="grammar failed"):
            for c in oai.chat.completions.create(model="default", stream=True, **body):
                chunks.append(c)
    assert chunks and all(c.choices[0].finish_reason is None for c in chunks if c.choices)
    lines: list[str] = []
    _sse_lines(demo_server, "/v1/chat/completions", {**body, "stream": True}, lines)
    assert "grammar_failed" in _data(lines)[-1]["error"]["code"] and "data: [DONE]" not in lines
    # Anthropic: an error response, and in a stream an ``event: error``, never end_turn.
    abody = {**MSG, "max_tokens": 32, "output_format": {"type": "json_schema",
                                                        "schema": FAILS_MID_REPLY}}
    r = _post(demo_server, "/v1/messages", abody)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    lines = []
    _sse_lines(demo_server, "/v1/messages", {**abody, "stream": True}, lines)
    assert "event: error" in lines and not any("end_turn" in x for x in lines), lines
    assert lines[-2].startswith("data: ") and "grammar failed" in lines[-2]


def test_structured_output_still_works(demo_server, log):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = _post(demo_server, "/v1/chat/completions", {**CHAT, "max_tokens": 40,
                                                    "response_format": _schema(schema)})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"])["a"], int)


# ---------------------------------------------------------------------- B: compile off-thread

def test_huge_schemas_do_not_stall_a_concurrent_stream(demo_server, log):
    lines: list[str] = []
    stamps: list[float] = []
    stream = threading.Thread(target=_sse_lines, args=(
        demo_server, "/v1/completions", {"prompt": "Once", "max_tokens": 600, "stream": True,
                                         "response_format": LONG}, lines, stamps))
    stream.start()
    while len(stamps) < 5:
        time.sleep(0.01)
    t0 = time.perf_counter()
    refused = _post(demo_server, "/v1/chat/completions",
                    {**CHAT, "response_format": _schema(_props(10_000))})
    big = {**_props(5000), "required": [f"p{i}" for i in range(5000)]}  # legal, slow to build
    legal = _post(demo_server, "/v1/chat/completions", {**CHAT, "response_format": _schema(big)})
    t1 = time.perf_counter()
    stream.join(90)
    assert refused.status_code == 400 and legal.status_code == 200, (refused.text, legal.text)
    during = [b - a for a, b in zip(stamps, stamps[1:]) if b > t0 and a < t1]
    assert during and max(during) < 1.5, max(during)
    assert _data(lines)[-1]["choices"][0]["finish_reason"] == "length"


# ---------------------------------------------------------------------- C: 500s -> 400s

@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty",
                                   "frequency_penalty"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_400_naming_the_field(demo_server, log, field, literal):
    raw = json.dumps(CHAT)[:-1] + f', "{field}": {literal}}}'
    r = _post(demo_server, "/v1/chat/completions", raw)
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == field


def test_deep_nesting_is_400(demo_server, log):
    deep = "[" * 5000 + "]" * 5000
    r = _post(demo_server, "/v1/chat/completions", json.dumps(CHAT)[:-1] + f', "x": {deep}}}')
    assert r.status_code == 400 and "nested too deeply" in r.text, r.text
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
    r = _post(demo_server, "/v1/chat/completions", {**CHAT, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]})
    assert r.status_code == 400 and "arguments are nested too deeply" in r.text, r.text


@pytest.mark.parametrize("path,body,says", [
    ("/v1/messages", {**MSG, "system": 5}, "system must be a string"),
    ("/v1/messages", {**MSG, "system": [{"type": "text", "text": 5}]},
     "system[0]: text must be a string"),
    ("/v1/messages", {**MSG, "messages": TOOL_TURN + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": 5}]}]},
     "messages[2].content[0].content must be a string"),
    ("/v1/messages", {**MSG, "messages": TOOL_TURN + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"text": 5}]}]}]},
     "messages[2].content[0].content[0]: text must be a string"),
    ("/v1/messages/count_tokens", {**MSG, "system": 5}, "system must be a string"),
    ("/v1/messages", {**MSG, "messages": TOOL_TURN + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [PNG]}]}]},
     "'image' blocks are not supported"),
    ("/v1/messages", {**MSG, "messages": [{"role": "user", "content": [PNG]}]},
     "has no vision encoder"),  # the demo is text only (images: tests/server/test_images.py)
], ids=["system-5", "system-text-5", "tool-result-5", "tool-result-text-5",
        "count-tokens-system-5", "tool-result-image", "image"])
def test_anthropic_malformed_fields_are_400(demo_server, log, path, body, says):
    r = _post(demo_server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and says in r.text, r.text


# ---------------------------------------------------------------------- E: logprobs

@pytest.mark.parametrize("path,extra,param", [
    ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 2}, "logprobs"),
    ("/v1/completions", {"logprobs": 0}, "logprobs"),
])
def test_logprobs_are_400_not_null(demo_server, log, path, extra, param):
    body = {**CHAT, **extra} if "chat" in path else {"prompt": "hi", "max_tokens": 4, **extra}
    r = _post(demo_server, path, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "not supported" in r.text


def test_logprobs_false_is_accepted(demo_server, log):
    r = _post(demo_server, "/v1/chat/completions", {**CHAT, "logprobs": False,
                                                    "top_logprobs": None})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------- D: a queued client leaves

def test_queued_client_leaving_is_not_a_server_error(tmp_path):
    server = start_serve(tmp_path, "--max-streams", "1")
    try:
        watch = Log(server)
        first: list[httpx.Response] = []
        busy = threading.Thread(target=lambda: first.append(_post(server, "/v1/completions", {
            "prompt": "Once", "max_tokens": 1500, "response_format": LONG}, timeout=90)))
        busy.start()
        # the first must be decoding (its schema compiles first, off the loop) before the
        # second is sent, or the second would run first and not queue
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/health", timeout=5).json()["busy"] < 1:
            assert time.monotonic() < deadline and busy.is_alive(), first
            time.sleep(0.05)
        with pytest.raises(httpx.TimeoutException):  # queued behind the first, gives up
            _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 4}, timeout=2)
        busy.join(90)
        assert first and first[0].status_code == 200, first
        text = watch.text()
        assert "ClientGone" not in text and " 500" not in text
        watch.assert_clean_and_serving()
    finally:
        server.proc.kill()
        server.proc.wait(10)
        server.close()


# ---------------------------------------------------------------------- E: a drain cuts streams

def test_drain_reports_cut_streams_as_errors_not_finished(tmp_path):
    server = start_serve(tmp_path, "--drain-seconds", "1")
    try:
        watch = Log(server)
        oai: list[str] = []
        anth: list[str] = []
        readers = [threading.Thread(target=_sse_lines, args=(server, path, body, out)) for
                   path, body, out in (
                       ("/v1/chat/completions", {**CHAT, "max_tokens": 3000, "stream": True,
                                                 "response_format": LONG}, oai),
                       ("/v1/messages", {**MSG, "max_tokens": 3000, "stream": True,
                                         "output_format": {"type": "json_schema",
                                                           "schema": LONG["json_schema"]["schema"]}},
                        anth))]
        for t in readers:
            t.start()
        while len(_data(oai)) < 4 or len(anth) < 12:
            time.sleep(0.01)
        assert server.stop(signal.SIGTERM) == 0
        for t in readers:
            t.join(20)
        last = _data(oai)[-1]
        assert last["error"]["code"] == "cancelled" and "shutting down" in last["error"]["message"]
        assert all(c["choices"][0]["finish_reason"] is None for c in _data(oai)[:-1]
                   if c.get("choices"))
        assert "event: error" in anth and not any("end_turn" in x for x in anth), anth[-6:]
        text = watch.text()
        assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)
        server.close()


# ---------------------------------------------------------------------- C: EOS outside the vocab

def test_serve_refuses_a_model_whose_eos_is_outside_its_vocab(tmp_path):
    from tests.reliability import broken
    from tests.tinymodels import build_tiny_model

    folder = build_tiny_model(tmp_path / "m")
    broken.set_text(eos_token_id=10**9)(folder)
    p = subprocess.run([sys.executable, "-m", "engine", "serve", "--port", "0", "--model",
                        str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "MTPCHAT_HOME": str(tmp_path),
                            "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    assert p.returncode != 0 and "eos_token_id 1000000000" in p.stderr, p.stderr[-2000:]
    assert "config.json" in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------------- E: generate --stop ""

def test_generate_rejects_an_empty_stop_string(tmp_path):
    p = subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt", "hi",
                        "--max-tokens", "2", "--stop", ""], cwd=ROOT, capture_output=True,
                       text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "MTPCHAT_HOME": str(tmp_path),
                            "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and "a stop string cannot be empty" in p.stderr, p.stderr


def test_current_anthropic_sdk_output_config_format_constrains_the_reply(demo_server):
    """The ``anthropic`` SDK sends structured output as ``output_config.format`` (its older
    top-level ``output_format`` is read too): the reply is JSON following the schema."""
    import anthropic

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
              "required": ["name"], "additionalProperties": False}
    with anthropic.Anthropic(base_url=demo_server.url, api_key="x", max_retries=0) as client:
        msg = client.messages.create(
            model="claude-test", max_tokens=48,
            messages=[{"role": "user", "content": "What does os.path.join do?"}],
            output_config={"format": {"type": "json_schema", "schema": schema}})
    got = json.loads("".join(b.text for b in msg.content if b.type == "text"))
    assert set(got) == {"name"} and isinstance(got["name"], str)
    r = _post(demo_server, "/v1/messages", {**MSG, "output_config": 5})
    assert r.status_code == 400 and "output_config" in r.text
    r = _post(demo_server, "/v1/messages", {**MSG, "output_config": {"format": {
        "type": "json_schema", "schema": {"$ref": "#"}}}})
    assert r.status_code == 400 and "output_config.format" in r.text
