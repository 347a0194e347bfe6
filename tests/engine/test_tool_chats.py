"""The demo model's tool chats (``engine.training.tool_chats``): what the model is trained on is
what the app sends and what ``python_doc`` returns; the held-out names are in no chat; the
calls parse with the server's parser; answers copy the result. No torch needed."""
from __future__ import annotations

import json

import pytest

from engine.server.templates import tool_call_xml
from engine.server.toolcalls import parse_tool_calls
from engine.training import tokenizer, tool_chats
from engine.training.tool_chats import ToolItem


@pytest.fixture(scope="module")
def items() -> list[ToolItem]:
    return tool_chats.collect_tool_items(limit=60)


@pytest.fixture(scope="module")
def chats(items) -> tool_chats.ToolChats:
    return tool_chats.build_tool_chats(items, seed=0, heldout=8)


def test_items_are_python_docs_own_results_and_answers_copy_them(items):
    from engine.tools.python_doc import python_doc

    assert len([i for i in items if not i.known]) == 60 and any(i.known for i in items)
    for item in items[:20]:
        assert item.result == python_doc(item.name)
        head, para = item.answer.split("\n\n", 1)
        assert head == f"`{item.result.splitlines()[0]}`"
        assert para.rstrip(".") in item.result  # a copy of the docstring, cut at a sentence
        assert len(item.result) <= tool_chats.MAX_RESULT and " at 0x" not in item.result


def test_the_system_turn_is_what_the_app_sends_for_python_doc():
    from app.tools import builtin
    from app.tools.catalog import Catalog
    from engine.server.templates import tools_section

    app_tools = Catalog.build([builtin.SERVER], {}).specs()
    assert tool_chats.tools_system() == tools_section(app_tools)


def test_heldout_names_are_in_no_chat_and_calls_parse(chats):
    assert len(chats.heldout) == 8
    text = "\n".join(json.dumps(c) for c in chats.chats)
    for h in chats.heldout:
        assert f"\\n{h['name']}\\n" not in text, h["name"]
        assert h["answer"].split("\n\n", 1)[0] == f"`{h['result'].splitlines()[0]}`"
    schemas = {"python_doc": {"type": "object", "properties": {"name": {"type": "string"}}}}
    ends = {"call": 0, "answer": 0}
    for chat in chats.chats:
        assert chat[0]["role"] == "system"
        assert chat[0]["content"].startswith(tool_chats.tools_system())
        last = chat[-1]["content"]
        ends["call" if last.startswith("<tool_call>") else "answer"] += 1
        for m in chat:
            if m["role"] == "assistant" and m["content"].startswith("<tool_call>"):
                _, calls = parse_tool_calls(m["content"], schemas)
                assert [c.name for c in calls] == ["python_doc"]
                args = calls[0].arguments
                args = json.loads(args) if isinstance(args, str) else args
                assert m["content"] == tool_call_xml("python_doc", args)
    assert ends["call"] > 0 and ends["answer"] > 0


def test_a_chat_ending_at_a_call_trains_it_after_the_empty_think_block(chats):
    """The app asks for a call after the generation prompt's empty think block: a chat that
    ends at its call renders that call exactly there."""
    chat = next(c for c in chats.chats if c[-1]["content"].startswith("<tool_call>"))
    prompt = tokenizer.render_chat(chat[:-1], add_generation_prompt=True,
                                   enable_thinking=False)
    assert tokenizer.render_chat(chat) == prompt + chat[-1]["content"] + "<|im_end|>\n"


def test_tool_chats_are_deterministic(items):
    a = tool_chats.build_tool_chats(items, seed=0, heldout=8)
    b = tool_chats.build_tool_chats(list(items), seed=0, heldout=8)
    assert a == b
    assert tool_chats.build_tool_chats(items, seed=1, heldout=8) != a
