"""End to end with a scripted model (no weights): tool calls both ways through the official
clients, tool results rendered back, engine failure -> 500 and still serving, queue overflow
-> 429, API key, disconnect -> cancel. The server runs in this process on a free port."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from engine.server.runner import start_server
from tests.server.fakes import ScriptedModel
from tests.server.test_toolcalls import QWEN35, TOOLS

pytestmark = pytest.mark.timeout(60)

ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": "weather",
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


@pytest.fixture(scope="module")
def served():
    model = ScriptedModel()
    server = start_server(model, port=0, max_queue=1, max_streams=1)  # one runs, others wait
    yield model, server
    server.stop(stop_scheduler=True)


@pytest.fixture()
def oai(served):
    import openai

    with openai.OpenAI(base_url=served[1].url + "/v1", api_key="unused", max_retries=0) as client:  # closed at teardown: no socket left to the GC
        yield client


@pytest.fixture()
def anth(served):
    import anthropic

    with anthropic.Anthropic(base_url=served[1].url, api_key="unused", max_retries=0) as client:
        yield client


def test_openai_tool_calls_non_streaming_and_result_round_trip(served, oai):
    model, _ = served
    model.replies[:] = [QWEN35, "It is sunny in Paris."]
    r = oai.chat.completions.create(model="scripted-fake", tools=TOOLS, messages=[
        {"role": "user", "content": "Weather in Paris and New York?"}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will check both cities.\n\n"
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_weather"]
    assert json.loads(calls[0].function.arguments) == {
        "city": "Paris", "days": 3, "metric": True, "hours": [9, 12]}
    # Send the results back: they must reach the model as <tool_response> blocks.
    msgs = [{"role": "user", "content": "Weather in Paris and New York?"},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
            {"role": "tool", "tool_call_id": calls[1].id, "content": "rain"}]
    r2 = oai.chat.completions.create(model="scripted-fake", tools=TOOLS, messages=msgs)
    assert r2.choices[0].message.content == "It is sunny in Paris."
    assert r2.choices[0].finish_reason == "stop"
    prompt = model.prompts[-1]
    assert "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>" in prompt
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in prompt


def test_openai_tool_calls_streamed(served, oai):
    model, _ = served
    model.replies[:] = [QWEN35]
    stream = oai.chat.completions.create(model="scripted-fake", tools=TOOLS, stream=True,
                                         messages=[{"role": "user", "content": "weather"}])
    content, args, names, ids, finish = "", {}, {}, {}, None
    for chunk in stream:
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.id:
                ids[tc.index], names[tc.index] = tc.id, tc.function.name
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and "<" not in content
    assert names == {0: "get_weather", 1: "get_weather"} and all(ids.values())
    assert json.loads(args[1]) == {"city": "New York", "opts": {"units": "si"}, "ratio": 0.5}


def test_no_tool_calls_means_no_tool_calls_finish(served, oai):
    # (tool_choice "required" now forces a call through a grammar: see test_forced_tool_calls)
    served[0].replies[:] = ["Just text."]
    r = oai.chat.completions.create(model="scripted-fake", tools=TOOLS, tool_choice="auto",
                                    messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls


def test_anthropic_tool_use_blocks_and_tool_result(served, anth):
    model, _ = served
    model.replies[:] = [QWEN35, "Done."]
    msg = anth.messages.create(model="claude-local-test", max_tokens=500, tools=ANTHROPIC_TOOLS,
                               messages=[{"role": "user", "content": "weather?"}])
    assert msg.stop_reason == "tool_use"
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses[0].input == {"city": "Paris", "days": 3, "metric": True, "hours": [9, 12]}
    assert uses[0].id.startswith("toolu_")
    follow = anth.messages.create(model="claude-local-test", max_tokens=50, tools=ANTHROPIC_TOOLS,
                                  messages=[{"role": "user", "content": "weather?"},
                                            {"role": "assistant", "content": msg.content},
                                            {"role": "user", "content": [
                                                {"type": "tool_result", "tool_use_id": uses[0].id,
                                                 "content": "sunny"}]}])
    assert follow.content[0].text == "Done."
    assert "<tool_response>\nsunny\n</tool_response>" in model.prompts[-1]


def test_anthropic_tool_use_streamed(served, anth):
    served[0].replies[:] = [QWEN35]
    with anth.messages.stream(model="claude-x", max_tokens=500, tools=ANTHROPIC_TOOLS,
                              messages=[{"role": "user", "content": "weather?"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[2].input == {"city": "New York", "opts": {"units": "si"}, "ratio": 0.5}


def test_engine_failure_is_500_and_server_keeps_serving(served, oai):
    import openai

    served[0].replies[:] = ["FAIL"]
    with pytest.raises(openai.InternalServerError) as err:
        oai.chat.completions.create(model="scripted-fake",
                                    messages=[{"role": "user", "content": "x"}])
    assert "scripted engine failure" in str(err.value)
    r = oai.chat.completions.create(model="scripted-fake", messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].message.content == "Hello from the fake."


def test_queue_overflow_is_429_with_retry_after(served):
    model, server = served
    model.seconds_per_cycle = 0.05
    model.replies[:] = ["x" * 60, "y" * 60]
    body = {"model": "scripted-fake", "messages": [{"role": "user", "content": "x"}]}
    results = []

    def post():
        results.append(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30))

    try:
        threads = [threading.Thread(target=post) for _ in range(2)]  # one runs, one waits
        model.started.clear()
        threads[0].start()
        assert model.started.wait(5)
        threads[1].start()
        deadline = time.time() + 5
        while server.scheduler.busy < 2 and time.time() < deadline:
            time.sleep(0.01)
        third = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        assert third.json()["error"]["type"] == "rate_limit_error"
        for t in threads:
            t.join()
        assert [r.status_code for r in results] == [200, 200]
    finally:
        model.seconds_per_cycle = 0.0


def test_disconnect_mid_stream_cancels_within_a_cycle(served):
    model, server = served
    model.seconds_per_cycle = 0.02
    model.replies[:] = ["z" * 3000]
    try:
        with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30, json={
                "stream": True, "messages": [{"role": "user", "content": "x"}]}) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i > 5:
                    break
        t0 = time.perf_counter()
        deadline = t0 + 5
        while server.scheduler.busy and time.perf_counter() < deadline:
            time.sleep(0.005)
        assert server.scheduler.busy == 0
        assert time.perf_counter() - t0 < 1.0  # 3000 chars would take 20 s
    finally:
        model.seconds_per_cycle = 0.0


@pytest.mark.parametrize("body,status,where", [
    (b"{not json", 400, "not valid JSON"),
    (json.dumps({"messages": []}).encode(), 400, "messages"),
    (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).encode(),
     404, "not loaded"),
    (json.dumps({"temperature": 9, "messages": [{"role": "user", "content": "x"}]}).encode(),
     400, "temperature"),
    (json.dumps({"mtp": {"depth": 9}, "messages": [{"role": "user", "content": "x"}]}).encode(),
     400, "mtp.depth"),
    (json.dumps({"response_format": {"type": "yaml"},
                 "messages": [{"role": "user", "content": "x"}]}).encode(), 400, "not supported"),
    (json.dumps({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}},
                 "messages": [{"role": "user", "content": "x"}]}).encode(), 400,
     "must be a JSON schema"),
])
def test_bad_openai_requests(served, body, status, where):
    r = httpx.post(served[1].url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == status and where in r.json()["error"]["message"]


def test_bad_anthropic_request_has_anthropic_shape(served):
    r = httpx.post(served[1].url + "/v1/messages", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_fields_are_ignored_and_depth_passes_through(served, oai):
    model, _ = served
    r = oai.chat.completions.create(model="scripted-fake", messages=[{"role": "user", "content": "x"}],
                                    extra_body={"mtp": {"depth": 3}, "whatever": [1, 2]})
    assert model.calls[-1]["depth"] == 3
    assert r.model_extra["mtp"]["depth"] == 3


def test_api_key_enforced():
    import openai

    server = start_server(ScriptedModel(), port=0, api_key="s3cret")
    try:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        with openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0) as good:
            assert good.models.list().data[0].id == "scripted-fake"
        r = httpx.post(server.url + "/v1/messages/count_tokens", headers={"x-api-key": "s3cret"},
                       json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["input_tokens"] > 0
        assert httpx.get(server.url + "/v1/models").status_code == 401
    finally:
        server.stop(stop_scheduler=True)
