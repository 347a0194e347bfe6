"""The agent-session bench's ``--content docs``: the demo's own tool use (``python_doc``) as an
agent session that grows turn by turn, each turn ending at the real result for a name the
demo never trained on (``engine.bench.agent_session.doc_conversation``)."""
import json

import pytest

import engine
from engine.bench.agent_session import doc_conversation
from engine.training.tool_chats import tools_system


def _words(msgs):
    return sum(len(m["content"].split()) for m in msgs)


def test_each_turn_extends_the_last_and_ends_at_a_held_out_result():
    model = engine.default_model_path()
    held = json.loads((model / "heldout_tools.json").read_text(encoding="utf-8"))
    turns = doc_conversation(4, 300, str(model))
    assert len(turns) == 4
    assert turns[0][0] == {"role": "system", "content": tools_system()}
    for t, msgs in enumerate(turns):
        h = held[t]
        assert msgs[-1] == {"role": "user",
                            "content": f"<tool_response>\n{h['result']}\n</tool_response>"}
        assert f"<parameter=name>\n{h['name']}\n</parameter>" in msgs[-2]["content"]
        assert msgs[-3] == {"role": "user", "content": h["prompt"]}
        if t:
            prev = turns[t - 1]
            assert msgs[:len(prev)] == prev  # the whole conversation is resent
            # the previous turn's answer in the trained form, then ~300 words of exchanges
            assert msgs[len(prev)] == {"role": "assistant", "content": held[t - 1]["answer"]}
            assert 300 <= _words(msgs) - _words(prev) < 900


def test_no_filler_exchange_is_about_a_held_out_name():
    model = engine.default_model_path()
    held = {h["name"] for h in json.loads((model / "heldout_tools.json").read_text("utf-8"))}
    msgs = doc_conversation(6, 400, str(model))[-1]
    asked = [m["content"] for m in msgs if m["role"] == "user"
             and not m["content"].startswith("<tool_response>")]
    named = [q.split("`")[1] for q in asked if q.startswith("What does `")]
    assert len(named) >= 10
    assert not held & set(named)


def test_a_model_without_held_out_tool_questions_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"needs a train-demo folder: .*\(heldout_tools\.json\)"):
        doc_conversation(2, 100, str(tmp_path))
