"""The Responses API (``POST /v1/responses``) through the official ``openai`` client, with a
scripted model (no weights) that emits Qwen tool calls and think blocks: output items,
streamed events (checked by the SDK's own stream accumulator), tool results back by
``previous_response_id`` and by full input, instructions, reasoning items, the bounded
store, and the 400s for fields that would change the reply but are not supported — in each
API's own error shape. The server runs in this process on a free port."""
from __future__ import annotations

import json

import httpx
import pytest

from engine.server.responses_api import ResponseStore
from engine.server.responses_items import input_messages
from tests.server.test_toolcalls import QWEN35, TOOLS

pytestmark = pytest.mark.timeout(60)

# The Responses API's flat function tools.
RTOOLS = [{"type": "function", "name": t["function"]["name"],
           "description": t["function"]["description"],
           "parameters": t["function"]["parameters"]} for t in TOOLS]
PARIS = {"city": "Paris", "days": 3, "metric": True, "hours": [9, 12]}
THINK = "<think>\nCheck the weather.\n</think>\n\n"


@pytest.fixture()
def oai(scripted_served):
    import openai

    with openai.OpenAI(base_url=scripted_served[1].url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _post(scripted_served, path: str, body: dict) -> httpx.Response:
    return httpx.post(scripted_served[1].url + path, json=body, timeout=30)


def test_function_call_then_result_by_previous_response_id(scripted_served, oai):
    model, _ = scripted_served
    model.replies[:] = [THINK + QWEN35, "Sunny in Paris, rain in New York."]
    r = oai.responses.create(model="scripted-fake", input="Weather in Paris and New York?",
                             tools=RTOOLS, instructions="Be brief.")
    assert r.status == "completed" and r.id.startswith("resp_")
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call",
                                          "function_call"]
    assert r.output[0].content[0].text == "Check the weather." and r.output[0].summary == []
    assert r.output_text == "I will check both cities.\n\n"
    calls = [o for o in r.output if o.type == "function_call"]
    assert json.loads(calls[0].arguments) == PARIS and calls[1].name == "get_weather"
    assert calls[0].call_id != calls[1].call_id and calls[0].status == "completed"
    assert r.usage.output_tokens == len(THINK + QWEN35)  # one token per character
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= len(THINK)
    assert model.prompts[-1].startswith("<|system|>Be brief.") or "Be brief." in model.prompts[-1]
    r2 = oai.responses.create(model="scripted-fake", previous_response_id=r.id, tools=RTOOLS,
                              input=[{"type": "function_call_output", "call_id": c.call_id,
                                      "output": out} for c, out in zip(calls, ("sunny", "rain"))])
    assert r2.output_text == "Sunny in Paris, rain in New York."
    assert r2.previous_response_id == r.id and [o.type for o in r2.output] == ["message"]
    prompt = model.prompts[-1]
    assert "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>" \
        in prompt
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in prompt
    assert "Weather in Paris and New York?" in prompt
    assert "Be brief." not in prompt  # instructions are not carried over (as OpenAI does)


def test_result_by_full_input_renders_the_same_prompt(scripted_served, oai):
    model, _ = scripted_served
    model.replies[:] = [QWEN35, "ok", "ok"]
    first = [{"role": "user", "content": "Weather?"}]
    r = oai.responses.create(model="scripted-fake", input=first, tools=RTOOLS, store=False)
    calls = [o for o in r.output if o.type == "function_call"]
    results = [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"}
               for c in calls]
    full = first + [o.model_dump(exclude_none=True) for o in r.output] + results
    oai.responses.create(model="scripted-fake", input=full, tools=RTOOLS)
    by_input = model.prompts[-1]
    with pytest.raises(Exception) as err:  # store=False: nothing to continue from
        oai.responses.create(model="scripted-fake", previous_response_id=r.id, input=results)
    assert err.value.status_code == 400 and "not found" in str(err.value)
    assert "<tool_response>\nsunny\n</tool_response>" in by_input
    assert by_input.count("<function=get_weather>") == 2


def test_streamed_events_through_the_sdk_accumulator(scripted_served, oai):
    model, _ = scripted_served
    model.replies[:] = [THINK + QWEN35]
    kinds = []
    with oai.responses.stream(model="scripted-fake", input="Weather?", tools=RTOOLS,
                              reasoning={"effort": "low", "summary": "auto"}) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert "response.reasoning_summary_text.done" in kinds
    assert kinds.count("response.function_call_arguments.done") == 2
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call",
                                              "function_call"]
    assert final.output[0].summary[0].text == "Check the weather."
    assert json.loads(final.output[2].arguments) == PARIS
    assert final.model_extra["mtp"]["completion_tokens"] == len(THINK + QWEN35)


def test_streamed_raw_events_are_numbered_and_text_joins(scripted_served, oai):
    model, _ = scripted_served
    model.replies[:] = ["Plain answer, no tools."]
    events = list(oai.responses.create(model="scripted-fake", input="hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert text == done.text == "Plain answer, no tools."
    assert events[-1].response.output_text == text and events[-1].response.usage.output_tokens > 0


def test_parallel_tool_calls_false_and_max_tool_calls_report_one_call(scripted_served, oai):
    model, _ = scripted_served
    for extra in ({"parallel_tool_calls": False}, {"max_tool_calls": 1}):
        model.replies[:] = [QWEN35]
        r = oai.responses.create(model="scripted-fake", input="Weather?", tools=RTOOLS, **extra)
        assert [o.type for o in r.output] == ["message", "function_call"], extra
    model.replies[:] = [QWEN35]
    r = oai.chat.completions.create(model="scripted-fake", tools=TOOLS, parallel_tool_calls=False,
                                    messages=[{"role": "user", "content": "weather"}])
    assert len(r.choices[0].message.tool_calls) == 1


def test_tool_choice_none_hides_the_tools(scripted_served, oai):
    model, _ = scripted_served
    model.replies[:] = ["no tools"]
    oai.responses.create(model="scripted-fake", input="hi", tools=RTOOLS, tool_choice="none")
    assert "get_weather" not in model.prompts[-1]


def test_max_output_tokens_makes_it_incomplete_and_mtp_headers(scripted_served, oai):
    model, _ = scripted_served
    model.replies[:] = ["A long reply that will be cut."]
    raw = oai.responses.with_raw_response.create(model="scripted-fake", input="hi",
                                                 max_output_tokens=5)
    r = raw.parse()
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "A lon" and r.output[0].status == "incomplete"
    assert raw.headers["x-mtp-depth"] and "x-mtp-tokens-per-second" in raw.headers
    assert model.calls[-1]["max_tokens"] == 5


def test_mtp_extension_sets_the_depth(scripted_served, oai):
    model, _ = scripted_served
    oai.responses.create(model="scripted-fake", input="hi", extra_body={"mtp": {"depth": 0}})
    assert model.calls[-1]["depth"] == 0
    r = _post(scripted_served, "/v1/responses", {"input": "hi", "mtp": {"depth": 9}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "mtp.depth"


def test_retrieve_and_delete(scripted_served, oai):
    r = oai.responses.create(model="scripted-fake", input="hi")
    assert oai.responses.retrieve(r.id).output_text == r.output_text
    oai.responses.delete(r.id)
    with pytest.raises(Exception) as err:
        oai.responses.retrieve(r.id)
    assert err.value.status_code == 404


def test_engine_failure_is_a_500_and_the_server_keeps_serving(scripted_served, oai):
    model, _ = scripted_served
    model.replies[:] = ["FAIL"]
    r = _post(scripted_served, "/v1/responses", {"input": "hi"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    model.replies[:] = ["ok"]
    assert oai.responses.create(model="scripted-fake", input="still there?").output_text == "ok"


def test_store_is_bounded_in_count_and_time():
    now = [0.0]
    store = ResponseStore(max_items=3, ttl_s=10, clock=lambda: now[0])
    for i in range(5):
        store.put(f"r{i}", [{"role": "user", "content": str(i)}], {"id": f"r{i}"})
    assert len(store) == 3 and store.get("r0") is None and store.get("r4") is not None
    now[0] = 9.9
    assert store.get("r2") is not None
    now[0] = 10.0
    assert store.get("r2") is None and len(store) == 0 and store.chars == 0
    small = ResponseStore(max_chars=200)  # and in size: the oldest go first
    for i in range(4):
        small.put(f"r{i}", [{"role": "user", "content": "x" * 40}], {"id": f"r{i}"})
    assert small.chars <= 200 and small.get("r3") is not None and small.get("r0") is None
    small.put("huge", [{"role": "user", "content": "x" * 500}], {"id": "huge"})
    assert small.get("huge") is None and small.get("r3") is not None


def test_input_items_become_template_messages():
    items = [{"role": "developer", "content": "sys"},
             {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                          {"type": "input_text", "text": "b"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "think"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "calling"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
             {"type": "function_call", "call_id": "c2", "name": "f", "arguments": ""},
             {"type": "function_call_output", "call_id": "c1", "output": "r1"}]
    msgs = input_messages(items)
    assert msgs[0] == {"role": "system", "content": "sys"}
    assert msgs[1] == {"role": "user", "content": "ab"}
    assert msgs[2]["reasoning_content"] == "think" and msgs[2]["content"] == "calling"
    assert [c["function"]["arguments"] for c in msgs[2]["tool_calls"]] == [{"x": 1}, {}]
    assert msgs[3] == {"role": "tool", "tool_call_id": "c1", "content": "r1"}


# ---------------------------------------------------------------------- refusals (400s)

RESPONSES_400 = [
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": RTOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                       "tools": []}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format"),
    ({"reasoning": {"effort": "enormous"}}, "reasoning.effort"),
    ({"input": [{"role": "user", "content": [{"type": "input_image",
                                              "image_url": "http://x/y.png"}]}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id"),
]


@pytest.mark.parametrize("extra,param", RESPONSES_400, ids=[p for _, p in RESPONSES_400])
def test_responses_refuses_what_it_would_ignore(scripted_served, extra, param):
    r = _post(scripted_served, "/v1/responses", {"model": "scripted-fake", "input": "hi", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


CHAT_400 = [({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
            ({"modalities": ["text", "audio"]}, "modalities"),
            ({"logit_bias": {"42": 10}}, "logit_bias"),
            ({"verbosity": "high"}, "verbosity"),
            ({"web_search_options": {}}, "web_search_options"),
            ({"functions": [{"name": "f"}]}, "functions"),
            ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
            ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
            ({"reasoning_effort": "huge"}, "reasoning_effort")]


@pytest.mark.parametrize("extra,param", CHAT_400, ids=[p for _, p in CHAT_400])
def test_chat_refuses_what_it_would_ignore(scripted_served, extra, param):
    r = _post(scripted_served, "/v1/chat/completions",
              {"model": "scripted-fake", "messages": [{"role": "user", "content": "hi"}], **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_completions_refuse_best_of_echo_suffix(scripted_served):
    for extra in ({"best_of": 3}, {"echo": True}, {"suffix": "end"}):
        r = _post(scripted_served, "/v1/completions", {"prompt": "x", **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(extra)), r.text


ANTHROPIC_400 = [({"container": "c1"}, "container"),
                 ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
                  "mcp_servers"),
                 ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
                  "context_management"),
                 ({"output_config": {"effort": "low"}}, "output_config.effort"),
                 ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
                 ({"tool_choice": {"type": "any"}}, "tool_choice"),
                 ({"thinking": {"type": "sometimes"}}, "thinking"),
                 ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant",
                   "content": [{"type": "server_tool_use", "id": "s", "name": "web_search",
                                "input": {}}]}]}, "messages")]


@pytest.mark.parametrize("extra,param", ANTHROPIC_400, ids=[p for _, p in ANTHROPIC_400])
def test_anthropic_refuses_what_it_would_ignore(scripted_served, extra, param):
    body = {"model": "claude-x", "max_tokens": 20,
            "messages": [{"role": "user", "content": "hi"}], **extra}
    r = _post(scripted_served, "/v1/messages", body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
    assert param.split(".")[-1] in err["error"]["message"], err


def test_anthropic_clear_thinking_edit_is_applied():
    """Claude Code sends context_management {clear_thinking_20251015}: older turns' thinking
    leaves the prompt (keep N turns), or stays (keep all)."""
    from engine.server.anthropic_api import template_messages

    turn = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t",
                                               "signature": ""},
                                              {"type": "text", "text": "a"}]}]

    def thoughts(keep):
        edit = {"type": "clear_thinking_20251015"} | ({} if keep is None else {"keep": keep})
        msgs = template_messages({"messages": turn * 3 + [{"role": "user", "content": "q"}],
                                  "context_management": {"edits": [edit]}})
        return [bool(m.get("reasoning_content")) for m in msgs if m["role"] == "assistant"]

    assert thoughts("all") == [True, True, True]
    assert thoughts({"type": "thinking_turns", "value": 2}) == [False, True, True]
    assert thoughts(None) == [False, False, True]  # Anthropic's default: keep 1 turn


def test_anthropic_single_tool_use_and_adaptive_thinking(scripted_served):
    import anthropic

    model, server = scripted_served
    tools = [{"name": "get_weather", "description": "w",
              "input_schema": TOOLS[0]["function"]["parameters"]}]
    model.replies[:] = [QWEN35]
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as client:
        msg = client.messages.create(
            model="claude-x", max_tokens=600, tools=tools, thinking={"type": "adaptive"},
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": "weather?"}])
    assert [b.type for b in msg.content] == ["text", "tool_use"] and msg.stop_reason == "tool_use"


def test_a_codex_shaped_streamed_request(scripted_served):
    """The fields Codex CLI sends (store off, encrypted reasoning asked for, a summary, one call
    at a time, a cache key), read raw from the SSE stream."""
    model, server = scripted_served
    model.replies[:] = [THINK + QWEN35]
    body = {"model": "gpt-5-codex", "instructions": "You are a coding agent.", "stream": True,
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "Weather?"}]}],
            "tools": [{**RTOOLS[0], "strict": False}], "tool_choice": "auto",
            "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "session-1"}
    events = []
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and final["store"] is False
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][0]["summary"][0]["text"] == "Check the weather."
    assert json.loads(final["output"][2]["arguments"]) == PARIS
    assert final["parallel_tool_calls"] is False and final["mtp"]["completion_tokens"] > 0
