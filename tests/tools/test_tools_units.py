"""The pieces of the tools without a window: mcp.json, importing other apps' files, the
built-in python_doc, the catalog, and stored messages -> the chat template's tool turns
(thinking and calls interleaved as a Qwen3.5-style template expects)."""
from __future__ import annotations

import json
import os

import pytest

from app.db import Message
from app.tools import builtin
from app.tools.catalog import Catalog
from app.tools.config import (ConfigError, ToolPrefs, filesystem_server, import_sources,
                              load_config, merge_import, parse_config)
from app.tools.history import template_message, visible_answer
from app.tools.host import ServerState, ToolInfo


@pytest.mark.parametrize("text, where", [
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"mcpServers": []}', "mcpServers: expected an object"),
    ('{"mcpServers": {"a": {"args": ["x"]}}}', "mcpServers.a: needs \"command\""),
    ('{"mcpServers": {"a": {"command": "x", "args": "y"}}}', "mcpServers.a.args"),
    ('{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}', "mcpServers.a.env"),
    ('{"mcpServers": {"a": {"url": "file:///etc/passwd"}}}', "mcpServers.a.url"),
    ('{"mcpServers": {"a/b": {"command": "x"}}}', "a server name"),
    ('{"mcpServers": {"python": {"command": "x"}}}', "name of the built-in tools"),
])
def test_malformed_config_is_one_line(text, where):
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert where in str(e.value) and "\n" not in str(e.value)


def test_config_schema_of_lm_studio_and_claude(tmp_path):
    specs = parse_config(json.dumps({"mcpServers": {
        "fs": {"command": "npx", "args": ["-y", "pkg", "/tmp"], "env": {"A": "1"}},
        "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
        "off": {"command": "x", "disabled": True}}}))
    assert specs["fs"].kind == "stdio" and specs["fs"].args == ("-y", "pkg", "/tmp")
    assert specs["fs"].env == (("A", "1"),)
    assert specs["web"].kind == "http" and specs["web"].headers == (("Authorization", "Bearer x"),)
    assert specs["off"].disabled
    assert load_config(tmp_path / "none.json") == ({}, None)
    bad = tmp_path / "mcp.json"
    bad.write_text("{oops")
    specs, err = load_config(bad)
    assert specs == {} and "mcp.json is not valid" in err and "\n" not in err


def test_import_reads_claude_and_lm_studio_files_only(tmp_path):
    claude = tmp_path / ".config" / "Claude" / "claude_desktop_config.json"
    lms = tmp_path / ".lmstudio" / "mcp.json"
    mac = tmp_path / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"
    for path, name in ((claude, "linux"), (lms, "lms"), (mac, "mac")):
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"mcpServers": {name: {"command": name}},
                                    "otherSetting": True}))
    os.chmod(lms, 0o444)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (claude, lms, mac)}
    found = import_sources(tmp_path)
    assert [(label, p) for label, p in found] == [
        ("Claude Desktop", claude), ("Claude Desktop", mac), ("LM Studio", lms)]
    text = '{"mcpServers": {"lms": {"command": "mine"}}}'
    for _, p in found:
        text, added = merge_import(text, p)
    servers = json.loads(text)["mcpServers"]
    assert servers == {"lms": {"command": "mine"}, "linux": {"command": "linux"},
                       "mac": {"command": "mac"}}  # a name already there is kept
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in before} == before
    assert import_sources(tmp_path / "nobody") == []


def test_filesystem_server_gets_only_the_chosen_folders(tmp_path):
    entry = filesystem_server([str(tmp_path / "a"), str(tmp_path / "b")])
    assert entry["args"][2:] == [str((tmp_path / "a").resolve()), str((tmp_path / "b").resolve())]
    with pytest.raises(ConfigError):
        filesystem_server([])


def test_prefs_are_tolerant():
    assert ToolPrefs.from_dict({"timeout_s": "x", "max_steps": 10**9}) == ToolPrefs()
    p = ToolPrefs().with_allowed("s", "t").with_allowed("s", "u").with_allowed("s", "t", False)
    assert p.allows("s", "u") and not p.allows("s", "t") and not p.allows("other", "u")
    assert ToolPrefs.from_dict(p.to_dict()) == p


def test_python_doc_is_the_real_docstring_bounded_and_read_only():
    import os.path as osp
    text, err = builtin.call_builtin("python_doc", {"name": "os.path.join"})
    assert not err and text.startswith("os.path.join(") and osp.join.__doc__.strip()[:30] in text
    long_text, _ = builtin.call_builtin("python_doc", {"name": "argparse"})
    assert len(long_text) <= builtin.MAX_CHARS + 40
    for name, why in (("antigravity", "side effects"), ("surely_no_such_module", "not a standard-library"),
                      ("os; import x", "not a dotted"), ("os.nope", "no attribute")):
        text, err = builtin.call_builtin("python_doc", {"name": name})
        assert err and why in text
    assert builtin.call_builtin("python_doc", {})[1]
    assert "antigravity" not in __import__("sys").modules


def test_catalog_names_and_collisions():
    states = {"a": ServerState("a", "ready", (ToolInfo("read", "A"), ToolInfo("only_a", "x"))),
              "b": ServerState("b", "ready", (ToolInfo("read", "B"),)),
              "c": ServerState("c", "starting", (ToolInfo("late", ""),))}
    cat = Catalog.build(["python", "a", "b", "c"], states)
    assert sorted(cat.entries) == ["a__read", "b__read", "only_a", "python_doc"]
    assert cat.resolve("b__read") == ("b", "read") and cat.resolve("late") is None
    assert cat.specs()[0]["function"]["name"] == "python_doc"
    assert not Catalog.build([], states)


def msg(i, role, content, meta=None):
    return Message(i, 1, role, content, 0.0, meta or {})


CALL = {"id": "c1", "name": "python_doc", "server": "python", "tool": "python_doc",
        "arguments": {"name": "json.dumps"}, "state": "done"}


def test_template_messages():
    plain = msg(1, "assistant", "<think>\nhm\n</think>\n\nHello")
    assert template_message(plain) == {"role": "assistant", "content": "Hello"}
    step = msg(2, "assistant", "<think>\nneed docs\n</think>\n\nLet me check.\n\n<tool_call>\n"
               "<function=python_doc>\n<parameter=name>\njson.dumps\n</parameter>\n</function>\n"
               "</tool_call>", {"tool_calls": [CALL]})
    assert template_message(step) == {
        "role": "assistant", "content": "Let me check.", "reasoning_content": "need docs",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "python_doc", "arguments": {"name": "json.dumps"}}}]}
    cancelled = msg(3, "assistant", step.content, {"tool_calls": [{**CALL, "state": "cancelled"}]})
    assert "tool_calls" not in template_message(cancelled)
    result = msg(4, "tool", "json.dumps(obj)", {"tool_call_id": "c1", "name": "python_doc"})
    assert template_message(result) == {"role": "tool", "content": "json.dumps(obj)",
                                        "tool_call_id": "c1", "name": "python_doc"}


@pytest.mark.parametrize("text, shown", [
    ("Hi <tool_call>\n<function=f>", "Hi "),
    ("Hi <tool_c", "Hi "),
    ("a <tool_call>x</tool_call> b", "a  b"),
    ("plain < text", "plain < text"),
])
def test_visible_answer_hides_call_markup(text, shown):
    assert visible_answer(text) == shown


def test_thinking_and_calls_interleave_in_a_qwen_style_template():
    from transformers import AutoTokenizer

    from engine.models.chat_template import apply
    from engine.resources import default_model_path
    from tests.engine.models.test_chat_template import QWEN_STYLE

    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    tok.chat_template = QWEN_STYLE
    old_step = msg(2, "assistant", "<think>\nold thoughts\n</think>\n\nOld answer.")
    step = msg(4, "assistant", "<think>\nneed docs\n</think>\n\nLet me check.\n\n<tool_call>…"
               "</tool_call>", {"tool_calls": [CALL]})
    result = msg(5, "tool", "json.dumps(obj, ...)", {"tool_call_id": "c1", "name": "python_doc"})
    stored = [msg(1, "user", "hi"), old_step, msg(3, "user", "What does json.dumps do?"),
              step, result]
    messages = [m for m in (template_message(s) for s in stored) if m]
    text = apply(tok, messages, tokenize=False, add_generation_prompt=True, enable_thinking=True,
                 tools=[{"type": "function", "function": {"name": "python_doc",
                                                          "parameters": {}}}])
    assert "old thoughts" not in text  # before the last question: dropped
    assert ("<|im_start|>assistant\n<think>\nneed docs\n</think>\n\nLet me check.\n<tool_call>\n"
            '{"name": "python_doc", "arguments": {"name": "json.dumps"}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\njson.dumps(obj, ...)\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n") in text


def test_a_chat_without_mcp_servers_never_imports_the_sdk(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "import app.chat.main_window\n"
        "from app.db import ChatStore\n"
        "from app.tools.manager import ToolsManager\n"
        f"store = ChatStore({str(tmp_path / 'c.db')!r})\n"
        "conv = store.create_conversation()\n"
        f"m = ToolsManager(store, config_file={str(tmp_path / 'mcp.json')!r}, "
        f"log_dir={str(tmp_path)!r})\n"
        "m.set_chat_servers(conv, ['python'])\n"
        "assert [s['function']['name'] for s in m.catalog_for(conv).specs()] == ['python_doc']\n"
        "assert m.call(conv, 'c', 'python', 'python_doc', {'name': 'os.sep'}).result(10).text\n"
        "m.shutdown()\n"
        "print(sorted(n for n in sys.modules if n == 'mcp' or n.startswith('mcp.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "QT_QPA_PLATFORM": "offscreen"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
