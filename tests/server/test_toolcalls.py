"""The Qwen tool-call parser, the think splitter and the template paths, on recorded model
output, streamed (in every chunking) and not."""
from __future__ import annotations

import json

import pytest

from engine.server.reasoning import ThinkSplitter
from engine.server.reply_parts import ReplyParser, collect
from engine.server.toolcalls import (
    Text, ToolArgs, ToolCallParser, ToolEnd, ToolStart, convert_value, parse_tool_calls,
    schemas_of)

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "hours": {"type": "array"}, "opts": {"type": "object"}, "ratio": {"type": "number"}}}}}]
SCHEMAS = schemas_of(TOOLS)

# What Qwen3.5 writes (the Qwen3-Coder XML form), two calls after some text.
QWEN35 = ("I will check both cities.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
          "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n"
          "</parameter>\n<parameter=hours>\n[9, 12]\n</parameter>\n</function>\n</tool_call>\n"
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
          "<parameter=opts>\n{\"units\": \"si\"}\n</parameter>\n<parameter=ratio>\n0.5\n"
          "</parameter>\n</function>\n</tool_call>")
QWEN3 = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
EXPECTED = [("get_weather", {"city": "Paris", "days": 3, "metric": True, "hours": [9, 12]}),
            ("get_weather", {"city": "New York", "opts": {"units": "si"}, "ratio": 0.5})]


def _stream(text: str, size: int):
    p = ToolCallParser(SCHEMAS)
    pieces = []
    for i in range(0, len(text), size):
        pieces += p.feed(text[i:i + size])
    return pieces + p.flush(), p


def test_qwen35_xml_calls_parse_with_schema_types():
    text, calls = parse_tool_calls(QWEN35, SCHEMAS)
    assert text == "I will check both cities.\n\n"
    assert [(c.name, c.arguments) for c in calls] == EXPECTED
    assert json.loads(calls[0].arguments_json) == EXPECTED[0][1]


def test_qwen3_json_form_parses():
    text, calls = parse_tool_calls(QWEN3, SCHEMAS)
    assert text == "Sure.\n"
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Oslo", "days": 2})]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 10_000])
def test_streaming_equals_non_streaming_in_any_chunking(size):
    pieces, parser = _stream(QWEN35, size)
    text = "".join(p.text for p in pieces if isinstance(p, Text))
    assert text == "I will check both cities.\n\n"
    assert "<" not in text  # no markup leaks, even half a tag
    starts = [p for p in pieces if isinstance(p, ToolStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_weather")]
    for i, (_, args) in enumerate(EXPECTED):
        frags = "".join(p.fragment for p in pieces if isinstance(p, ToolArgs) and p.index == i)
        assert json.loads(frags) == args
    ends = [p for p in pieces if isinstance(p, ToolEnd)]
    assert [e.arguments for e in ends] == [a for _, a in EXPECTED]
    # The start of each call comes before its arguments.
    order = [type(p).__name__ for p in pieces if not isinstance(p, Text)]
    assert order[0] == "ToolStart" and order[-1] == "ToolEnd"


def test_text_that_only_looks_like_a_tag_is_released():
    pieces, parser = _stream("a < b and <tool is not a call", 1)
    assert "".join(p.text for p in pieces) == "a < b and <tool is not a call"
    assert parser.calls == []


def test_unfinished_or_garbage_blocks():
    text, calls = parse_tool_calls("x <tool_call>not json</tool_call> y", SCHEMAS)
    assert (text, calls) == ("x <tool_call>not json</tool_call> y", [])
    text, calls = parse_tool_calls("x <tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
                                   "</parameter>\n", SCHEMAS)  # cut off by max_tokens
    assert text == "x " and calls[0].arguments == {"city": "Rome"}


def test_convert_value_by_schema():
    assert convert_value("42", {"type": "integer"}) == 42
    assert convert_value("4.0", {"type": "integer"}) == 4
    assert convert_value("False", {"type": "boolean"}) is False
    assert convert_value("007", {"type": "string"}) == "007"
    assert convert_value("oops", {"type": "number"}) == "oops"
    assert convert_value("[1]", None) == [1]
    assert convert_value("plain", None) == "plain"
    assert convert_value("3", {"type": ["integer", "null"]}) == 3


def test_think_splitter_prompt_opened_and_model_opened():
    for opened, text in ((True, "Let me think.\n</think>\n\nAnswer."),
                         (False, "<think>\nLet me think.\n</think>\n\nAnswer.")):
        for size in (1, 4, 100):
            s = ThinkSplitter(opened=opened)
            parts = []
            for i in range(0, len(text), size):
                parts += s.feed(text[i:i + size])
            parts += s.flush()
            reasoning = "".join(t for c, t in parts if c == "reasoning")
            content = "".join(t for c, t in parts if c == "content")
            assert (reasoning, content) == ("Let me think.", "Answer."), (opened, size)


def test_think_splitter_without_think_and_empty_block():
    s = ThinkSplitter()
    assert s.feed("Plain answer") + s.flush() == [("content", "Plain answer")]
    s = ThinkSplitter()
    parts = s.feed("<think>\n\n</think>\n\nHi") + s.flush()
    assert parts == [("content", "Hi")]


def test_tool_call_inside_thinking_is_not_dropped():
    # vLLM #39056: a call written inside <think> was lost.
    raw = "<think>\nI should call it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n" \
          "Lima\n</parameter>\n</function>\n</tool_call>\n</think>\n\n"
    got = collect(ReplyParser(schemas=SCHEMAS), raw)
    assert [(c.name, c.arguments) for c in got.calls] == [("get_weather", {"city": "Lima"})]
    assert "<tool_call>" not in got.reasoning + got.content


def test_without_tools_markup_stays_text():
    got = collect(ReplyParser(schemas=None), QWEN3)
    assert got.content == QWEN3 and got.calls == []


# ---------------------------------------------------------------------- templates

class _Tok:
    """A tokenizer stand-in that renders a Qwen3.5-like template with transformers' own
    Jinja renderer, one id per character (so tests can read the prompt back)."""

    chat_template = (
        "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n"
        "{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
        "{%- for m in messages %}{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
        "{{ m.content }}\n</tool_response><|im_end|>\n"
        "{%- elif m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
        "{%- for c in m.tool_calls %}<tool_call>\n<function={{ c.function.name }}>\n"
        "{%- for k, v in c.function.arguments | items %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n"
        "{%- endfor %}</function>\n</tool_call>{% endfor %}<|im_end|>\n"
        "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    def apply_chat_template(self, messages, *, tools=None, add_generation_prompt=True,
                            tokenize=True, **kw):
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(conversations=[messages], tools=tools,
                                            chat_template=self.chat_template,
                                            add_generation_prompt=add_generation_prompt, **kw)
        return self.encode(rendered[0]) if tokenize else rendered[0]

    def encode(self, text, add_special_tokens=False, **kw):
        return [ord(c) for c in text]


CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


def test_template_with_tools_renders_through_the_models_template():
    from engine.server.templates import chat_prompt_ids
    from tests.server.fakes import ScriptedModel

    model = ScriptedModel()
    model.tokenizer = _Tok()
    text = "".join(map(chr, chat_prompt_ids(model, CONVERSATION, tools=TOOLS)))
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert "<function=get_weather>" in text and "<parameter=city>\nParis\n</parameter>" in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_template_without_tools_gets_the_qwen35_layout_written_out():
    from engine.server.templates import chat_prompt_ids, tool_call_xml
    from tests.server.fakes import ScriptedModel

    model = ScriptedModel()  # no tokenizer: no template of its own for tools
    chat_prompt_ids(model, CONVERSATION + [{"role": "tool", "content": "second"}], tools=TOOLS)
    text = model.prompts[-1]
    assert text.startswith("<|system|># Tools") and '"get_weather"' in text
    assert tool_call_xml("get_weather", {"city": "Paris", "days": 3}) in text
    assert "<|user|><tool_response>\nsunny, 21 C\n</tool_response>\n<tool_response>\nsecond\n" \
           "</tool_response>" in text
    # The model's own output form parses back to the same call.
    _, calls = parse_tool_calls(tool_call_xml("get_weather", {"city": "Paris", "days": 3}),
                                SCHEMAS)
    assert calls[0].arguments == {"city": "Paris", "days": 3}


def test_no_tools_is_exactly_chat_ids():
    from engine.server.templates import chat_prompt_ids
    from tests.server.fakes import ScriptedModel

    model = ScriptedModel()
    msgs = [{"role": "user", "content": "hi"}]
    assert chat_prompt_ids(model, msgs) == model.chat_ids(msgs)
