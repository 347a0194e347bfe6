"""Pure text logic of the chat: think split, block splitting and its stability, draft spans,
settings parsing, stats line, export formats."""
from __future__ import annotations

import json

import pytest

from app.chat.export import to_json, to_markdown
from app.chat.markdown import (
    draft_spans_in,
    highlight_html,
    split_blocks,
    split_think,
    stable_count,
    strip_think,
    tinted_html,
)
from app.chat.conversations import make_title
from app.chat.session import Stream
from app.chat.stats_line import format_stats, stats_tooltip
from app.chat.settings import ChatSettings
from app.db import Conversation, Message
from app.fake.engine import DEFAULT_SCRIPT, THINK_SCRIPT, fake_model_info

SAMPLES = [
    DEFAULT_SCRIPT,
    THINK_SCRIPT + DEFAULT_SCRIPT,
    "# Title\n\nPara one\nstill one.\n\n- a\n- b\n\n  continued item b\n\n1. x\n2. y\n\n> quote\n",
    "Text\n\n~~~js\nlet a = 1;\n\n\nlet b = 2;\n~~~\nafter fence\n\n````\n```nested```\n````\n",
    "unterminated\n\n```python\nprint('x')\n",
    "".join(f"- item {i} " + "word " * 30 + "\n" for i in range(40)),  # long list: soft split
]


def test_split_think_variants():
    s = split_think("<think>\nplan\n</think>\n\nAnswer")
    assert (s.think, s.think_done, s.answer) == ("\nplan\n", True, "Answer")
    assert "<think>\nplan\n</think>\n\nAnswer"[s.answer_offset:] == "Answer"
    streaming = split_think("<think>half a tho")
    assert streaming.think == "half a tho" and not streaming.think_done and streaming.answer == ""
    assert split_think("<thi").think == ""  # could still become <think>
    plain = split_think("No reasoning here")
    assert plain.think is None and plain.answer == "No reasoning here"
    assert strip_think("<think>x</think>\nY") == "Y"


def test_split_blocks_kinds_and_code():
    blocks = split_blocks(DEFAULT_SCRIPT)
    assert [b.kind for b in blocks] == ["prose", "prose", "code", "prose"]
    code = blocks[2]
    assert code.lang == "python" and code.closed
    assert code.text.startswith("def fib") and code.text.endswith("return a")
    assert DEFAULT_SCRIPT[code.body_start:code.body_start + len(code.text)] == code.text
    tilde = split_blocks(SAMPLES[3])
    kinds = [(b.kind, b.lang) for b in tilde]
    assert ("code", "js") in kinds
    js = next(b for b in tilde if b.lang == "js")
    assert "let b = 2;" in js.text  # blank lines inside a fence stay inside
    assert split_blocks(SAMPLES[4])[-1].closed is False


def test_indented_continuation_stays_with_its_list():
    blocks = split_blocks(SAMPLES[2])
    item_b = next(b for b in blocks if "- a" in b.text)
    assert "continued item b" in item_b.text


def test_long_prose_is_split_at_list_items():
    blocks = split_blocks(SAMPLES[5])
    assert len(blocks) > 1
    assert all(b.text.startswith("- item") for b in blocks)


@pytest.mark.parametrize("text", SAMPLES, ids=["script", "think", "mixed", "fences",
                                              "open-fence", "long-list"])
def test_stable_blocks_never_change_as_text_grows(text):
    """The property streaming relies on: a block reported stable for a prefix is identical
    (text, kind, extent) to the block parsed from the complete text."""
    full = split_blocks(text)
    step = max(1, len(text) // 600)  # every prefix of the short samples; a sample of the long one
    for n in range(0, len(text) + 1, step):
        prefix = text[:n]
        blocks = split_blocks(prefix)
        k = stable_count(prefix, blocks, final=False)
        assert blocks[:k] == full[:k], n
    assert stable_count(text, full, final=True) == len(full)


def test_draft_spans_and_tint():
    assert draft_spans_in([(0, 5), (8, 12)], 3, 10) == [(0, 2), (5, 7)]
    html = tinted_html("a<b>c", [(1, 4)], "green")
    assert html == 'a<span style="background-color:green;">&lt;b&gt;</span>c'


def test_highlight_html_colours_code_and_survives_unknown_languages():
    out = highlight_html("def f():\n    return 1", "python", dark=False)
    assert out.startswith("<pre") and "style=" in out and "return" in out
    plain = highlight_html("x < y", "no-such-language", dark=True)
    assert "&lt;" in plain


def test_stream_tints_the_draft_share_of_each_delta():
    s = Stream(1, 1, 1, {})
    s.add_delta("abcdef", 3, [True, True, False])     # 2 of 3 tokens drafted -> 4 chars
    s.add_delta("gh", 1, [False])
    s.add_delta("ijkl", 2, [True, False])
    assert s.spans == [[0, 4], [8, 10]]
    assert s.apply_pending() and s.content == "abcdefghijkl" and s.tokens == 6
    assert not s.apply_pending()


def test_stream_measures_thinking_time():
    s = Stream(1, 1, 1, {})
    s.add_delta("<think>\nhmm", 2, [])
    s.apply_pending()
    assert "think_s" not in s.meta
    s.add_delta(" ok</think>\n\nDone", 3, [])
    s.apply_pending()
    assert isinstance(s.meta["think_s"], float) and s.meta["think_s"] >= 0


def test_chat_settings_round_trip_and_tolerance():
    s = ChatSettings(system_prompt="Be brief", temperature=0.3, depth=2, thinking=True)
    assert ChatSettings.from_dict(s.to_dict()) == s
    messy = {"temperature": "oops", "top_k": "7", "depth": 99, "unknown": 1, "depth_x": 2}
    parsed = ChatSettings.from_dict(messy)
    assert parsed.temperature == ChatSettings().temperature
    assert parsed.top_k == 7 and parsed.depth == ChatSettings().depth
    assert ChatSettings.from_dict({"depth": "auto"}).depth == "auto"


def test_depth_follows_model_capability():
    mtp = fake_model_info(max_depth=3)
    none = fake_model_info(has_mtp=False)
    assert ChatSettings(depth=6).depth_for(mtp) == 3
    assert ChatSettings(depth="auto").depth_for(mtp) == "auto"
    assert ChatSettings(depth="auto").depth_for(none) == 0
    assert ChatSettings(depth=2).depth_for(None) == 0


def test_stats_line():
    line = format_stats({"tokens": 120, "tokens_per_s": 41.25, "ttft_s": 0.314, "cycles": 50,
                         "tokens_per_cycle": 2.4, "accepted_per_cycle": 1.4, "depth": 3,
                         "prompt_tokens": 37})
    assert line == "41.2 tok/s · 2.4 tokens per step · first token 0.31 s · 120 tokens"
    assert "no speculation" in format_stats({"tokens": 3, "cycles": 3, "depth": 0})
    auto = format_stats({"tokens": 50, "cycles": 20, "tokens_per_cycle": 2.5,
                         "accepted_per_cycle": 1.5, "depth": 3, "depth_min": 1})
    assert auto == "2.5 tokens per step · 50 tokens"
    assert "2.50 tokens per decoding step (1.50 drafted tokens accepted per step, depths 1–3" \
        in stats_tooltip({"tokens": 50, "cycles": 20, "tokens_per_cycle": 2.5,
                          "accepted_per_cycle": 1.5, "depth": 3, "depth_min": 1})
    assert format_stats(None) == ""


def test_titles():
    assert make_title("  hello\n  world ") == "hello world"
    assert len(make_title("x" * 100)) == 48 and make_title("x" * 100).endswith("…")


def _conv_and_msgs():
    conv = Conversation(1, "Fib", 1_700_000_000.0, 1_700_000_100.0, {"system_prompt": "Be nice"})
    msgs = [Message(1, 1, "user", "fib?", 1.0, {}),
            Message(2, 1, "assistant", "<think>\nplan\n</think>\n\nHere:\n```py\nx=1\n```", 2.0,
                    {"think_s": 3.2, "stats": {"tokens": 9}})]
    return conv, msgs


def test_export_markdown():
    md = to_markdown(*_conv_and_msgs())
    assert md.startswith("# Fib\n")
    assert "## System\n\nBe nice" in md
    assert "## User\n\nfib?" in md
    assert "<summary>Thought for 3 s</summary>" in md and "plan" in md
    assert "## Assistant" in md and "```py\nx=1\n```" in md
    assert "<think>" not in md


def test_export_json_is_versioned_and_complete():
    data = json.loads(to_json(*_conv_and_msgs()))
    assert data["format"] == "mtpchat-conversation" and data["version"] == 1
    assert data["title"] == "Fib" and data["settings"]["system_prompt"] == "Be nice"
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["meta"]["think_s"] == 3.2
