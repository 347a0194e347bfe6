"""engine.models.chat_template renders exactly what transformers renders, within a budget."""
from __future__ import annotations

import pytest

from engine.errors import ChatTemplateError, GenerationError
from engine.models.chat_template import Limits, apply, chat_ids
from engine.resources import default_model_path

# A Qwen3-style template: tools, tool calls, tool responses, reasoning, namespace, reverse scan.
QWEN_STYLE = """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions.\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools>\\n\\nFor each call, return JSON within <tool_call></tool_call> tags.<|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>')) %}
        {%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}
                {%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
                {{- '<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city — «quoted» é",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CONVERSATION = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "<think>\nneed a tool\n</think>\n\nLet me check.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture(scope="module")
def demo_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_path()))


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False},
                                    {"add_generation_prompt": False},
                                    {"add_generation_prompt": True, "enable_thinking": True}])
def test_demo_model_renders_byte_identically(demo_tokenizer, kwargs):
    msgs = CONVERSATION[:2] + [{"role": "assistant", "content": "Sunny."},
                               {"role": "user", "content": "Thanks! ünïcode ✓"}]
    assert apply(demo_tokenizer, msgs, tokenize=False, **kwargs) == \
        demo_tokenizer.apply_chat_template(msgs, tokenize=False, **kwargs)
    assert chat_ids(demo_tokenizer, msgs, enable_thinking=kwargs.get("enable_thinking")) == \
        list(demo_tokenizer.apply_chat_template(
            msgs, tokenize=True, add_generation_prompt=True,
            **({"enable_thinking": kwargs["enable_thinking"]} if "enable_thinking" in kwargs
               else {}))["input_ids"])


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
@pytest.mark.parametrize("thinking", [None, False])
def test_qwen_style_template_with_tools_renders_byte_identically(demo_tokenizer, tools,
                                                                 thinking):
    tok = demo_tokenizer
    saved = tok.chat_template
    tok.chat_template = QWEN_STYLE
    try:
        kw = {"tools": tools, "add_generation_prompt": True}
        if thinking is not None:
            kw["enable_thinking"] = thinking
        ours = apply(tok, CONVERSATION, tokenize=False, **kw)
        assert ours == tok.apply_chat_template(CONVERSATION, tokenize=False, **kw)
        assert ("<tools>" in ours) == bool(tools) and "<tool_response>" in ours
    finally:
        tok.chat_template = saved


def test_transformers_still_compiles_through_the_swapped_function():
    from transformers.utils import chat_template_utils as ctu

    assert callable(getattr(ctu, "_compile_jinja_template", None)), (
        "transformers no longer has chat_template_utils._compile_jinja_template: "
        "engine.models.chat_template cannot apply its budget; adapt engine/models/chat_template.py")


def test_budget_limits_are_parameters(demo_tokenizer):
    msgs = [{"role": "user", "content": "x" * 5000}]
    with pytest.raises(ChatTemplateError, match="characters"):
        apply(demo_tokenizer, msgs, tokenize=False, limits=Limits(chars=1000))
    with pytest.raises(ChatTemplateError, match="iterations"):
        apply(demo_tokenizer, msgs * 50, tokenize=False, limits=Limits(steps=10))
    assert apply(demo_tokenizer, msgs, tokenize=False)  # the default budget is ample


def test_no_template_is_a_generation_error(demo_tokenizer):
    saved = demo_tokenizer.chat_template
    demo_tokenizer.chat_template = None
    try:
        with pytest.raises(GenerationError, match="no chat template"):
            apply(demo_tokenizer, [{"role": "user", "content": "hi"}])
    finally:
        demo_tokenizer.chat_template = saved
