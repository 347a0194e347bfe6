"""Structured output and forced tool calls with the embedded demo model (a real grammar over
real tokens), through each API's official client and its parse helpers: OpenAI's Responses
(``text.format``, ``responses.parse``), Chat Completions (``chat.completions.parse``, a named
``tool_choice``) and Anthropic's Messages (``messages.parse(output_format=Model)``, which sends
``output_config.format``; the older top-level ``output_format``; ``tool_choice: any``). Greedy
output must validate, and speculation must not change it."""
from __future__ import annotations

import json
from typing import Literal

import pydantic
import pytest

MODEL = "mtp-demo-qwen3_5"
Q = "What does os.path.join do?"

pytestmark = pytest.mark.timeout(300)


class Doc(pydantic.BaseModel):
    """A small schema the tiny demo model can finish (no free-running strings)."""

    kind: Literal["function", "class", "module"]
    documented: bool


# A tool whose arguments are bounded, so a forced call always closes.
DOC_PARAMS = {"type": "object", "additionalProperties": False, "required": ["name"],
              "properties": {"name": {"type": "string", "maxLength": 24}}}
RTOOL = {"type": "function", "name": "python_doc", "description": "The docstring of a Python "
         "object", "parameters": DOC_PARAMS}
CTOOL = {"type": "function", "function": {k: v for k, v in RTOOL.items() if k != "type"}}


@pytest.fixture()
def oai(shared_demo_server):
    import openai

    with openai.OpenAI(base_url=shared_demo_server.url + "/v1", api_key="unused",
                       max_retries=0) as client:
        yield client


@pytest.fixture()
def anth(shared_demo_server):
    import anthropic

    with anthropic.Anthropic(base_url=shared_demo_server.url, api_key="unused",
                             max_retries=0) as c:
        yield c


def _doc(text: str) -> Doc:
    return Doc.model_validate_json(text)


def test_responses_plain_text_equals_chat_completions(oai):
    """The same prompt through both OpenAI APIs, greedy: the same text."""
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": Q}],
                                       temperature=0, max_tokens=40)
    r = oai.responses.create(model=MODEL, input=Q, temperature=0, max_output_tokens=40)
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_responses_text_format_json_schema_greedy_and_speculation_equal(oai):
    fmt = {"type": "json_schema", "name": "doc", "strict": True,
           "schema": Doc.model_json_schema() | {"additionalProperties": False}}
    texts = {}
    for depth in (0, 2):
        r = oai.responses.create(model=MODEL, input=Q, temperature=0, max_output_tokens=60,
                                 text={"format": fmt}, extra_body={"mtp": {"depth": depth}})
        assert r.status == "completed", r
        texts[depth] = r.output_text
        _doc(r.output_text)
    assert texts[0] == texts[2]
    streamed = oai.responses.create(model=MODEL, input=Q, temperature=0, max_output_tokens=60,
                                    text={"format": fmt}, stream=True)
    deltas = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
    assert deltas == texts[0]


def test_responses_parse_with_a_pydantic_model(oai):
    parsed = oai.responses.parse(model=MODEL, input=Q, text_format=Doc, temperature=0,
                                 max_output_tokens=60)
    assert isinstance(parsed.output_parsed, Doc)


def test_chat_completions_parse_with_a_pydantic_model(oai):
    r = oai.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": Q}],
                                   response_format=Doc, temperature=0, max_tokens=60)
    assert isinstance(r.choices[0].message.parsed, Doc)


def test_anthropic_messages_parse_sends_output_config_and_validates(anth):
    msg = anth.messages.parse(model="claude-local", max_tokens=60, output_format=Doc,
                              messages=[{"role": "user", "content": Q}],
                              extra_body={"temperature": 0})
    assert isinstance(msg.parsed_output, Doc)
    schema = Doc.model_json_schema() | {"additionalProperties": False}
    for extra in ({"output_config": {"format": {"type": "json_schema", "schema": schema}}},
                  {"output_format": {"type": "json_schema", "schema": schema}}):  # older clients
        raw = anth.messages.create(model="claude-local", max_tokens=60,
                                   messages=[{"role": "user", "content": Q}],
                                   extra_body={"temperature": 0, **extra})
        assert raw.stop_reason == "end_turn"
        assert _doc(raw.content[0].text) == msg.parsed_output


def _args_ok(args: dict) -> bool:
    return set(args) == {"name"} and isinstance(args["name"], str) and len(args["name"]) <= 24


def test_forced_tool_calls_in_all_three_apis(oai, anth):
    depth_args = []
    for depth in (0, 2):
        r = oai.responses.create(model=MODEL, input=Q, temperature=0, max_output_tokens=80,
                                 tools=[RTOOL], tool_choice="required",
                                 extra_body={"mtp": {"depth": depth}})
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and [c.name for c in calls] == ["python_doc"], r.output
        depth_args.append(calls[0].arguments)
        assert _args_ok(json.loads(calls[0].arguments))
    assert depth_args[0] == depth_args[1]  # speculation does not change the forced call
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": Q}], temperature=0, max_tokens=80,
        tools=[CTOOL], tool_choice={"type": "function", "function": {"name": "python_doc"}})
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert _args_ok(json.loads(choice.message.tool_calls[0].function.arguments))
    msg = anth.messages.create(
        model="claude-local", max_tokens=80, messages=[{"role": "user", "content": Q}],
        tools=[{"name": "python_doc", "description": "doc", "input_schema": DOC_PARAMS}],
        tool_choice={"type": "any"}, extra_body={"temperature": 0})
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and uses and _args_ok(uses[0].input)


def test_forcing_an_unknown_tool_is_a_400(oai):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model=MODEL, input=Q, tools=[RTOOL],
                             tool_choice={"type": "function", "name": "nope"})
    assert "no tool named 'nope'" in str(err.value)


def test_the_demo_calls_python_doc_unforced_and_answers_from_the_result(oai):
    """Offered the built-in python_doc (the spec the app sends) and asked about a name it
    never trained on, the demo calls the tool by itself (``tool_choice`` auto), through Chat
    Completions and Responses, and answers from the result sent back: the signature line."""
    from engine.tools.python_doc import function_spec, python_doc

    name = "queue.LifoQueue"  # in engine.training.tool_chats' held-out names: in no chat
    question = f"What does `{name}` do?"
    tool = function_spec()
    first = oai.chat.completions.create(model=MODEL, temperature=0, max_tokens=60, tools=[tool],
                                        messages=[{"role": "user", "content": question}])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("python_doc",
                                                                          {"name": name})
    result = python_doc(name)
    second = oai.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=160, tools=[tool],
        messages=[{"role": "user", "content": question}, choice.message.model_dump(),
                  {"role": "tool", "tool_call_id": call.id, "content": result}])
    answer = second.choices[0].message.content
    assert answer.startswith(f"`{result.splitlines()[0]}`"), answer
    assert result.split("\n\n")[1] in answer, answer  # its docstring, copied
    rtool = {"type": "function", **tool["function"]}
    r = oai.responses.create(model=MODEL, input=question, temperature=0, max_output_tokens=60,
                             tools=[rtool])
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("python_doc", {"name": name})]
