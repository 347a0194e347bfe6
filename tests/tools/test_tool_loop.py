"""The tool loop in the chat window (pytest-qt), driven by the scripted fake model writing
Qwen3.5's tool-call form: allow, deny, always allow, Stop while a call waits or runs, the step
bound, a reopened chat, a tool result that contains a tool call, a malformed mcp.json."""
from __future__ import annotations

import json
import sys
import time

import pytest

from app.fake.engine import FakeModel
from app.tools import builtin
from app.tools.cards import ToolCallCard
from app.tools.result_widget import ToolResultWidget
from tests.app.chat_fixtures import make_window, send
from tests.tools.test_mcp_host import SCRIPT


def call_xml(function: str, **params) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={function}>\n{body}</function>\n</tool_call>"


DOC_CALL = "Let me check the documentation.\n\n" + call_xml("python_doc", name="os.path.join")
FINAL = "`os.path.join` joins path components with the right separator."


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MTPCHAT_HOME", str(home))
    return home


@pytest.fixture
def fake():
    return FakeModel(tokens_per_second=20000, think=False)


@pytest.fixture
def win(qtbot, tmp_path, home, fake):
    w = make_window(qtbot, tmp_path, fake)
    yield w
    w.close()


def cards(w) -> list[ToolCallCard]:
    return [c for mw in w.view.widgets.values() if mw.tool_panel is not None
            for c in mw.tool_panel.cards]


def pending(w) -> ToolCallCard | None:
    return next((c for c in cards(w) if c.state == "pending" and c.buttons), None)


def roles(w) -> list[str]:
    return [m.role for m in w.conversations.messages(w.conversations.current)]


def wait_idle(qtbot, w, timeout=10000) -> None:
    qtbot.waitUntil(lambda: not w.session.busy and not w.session.streams, timeout=timeout)


@pytest.fixture
def builtin_calls(monkeypatch):
    ran = []
    real = builtin.call_builtin

    def spy(tool, arguments):
        ran.append((tool, arguments))
        return real(tool, arguments)
    monkeypatch.setattr(builtin, "call_builtin", spy)
    return ran


def test_allow_runs_the_call_and_the_reply_continues(qtbot, win, fake, builtin_calls):
    win.tools.set_server(builtin.SERVER, True)
    fake.scripts[:] = [DOC_CALL, FINAL]
    send(qtbot, win, "What does os.path.join do?")
    qtbot.waitUntil(lambda: pending(win) is not None)
    card = pending(win)
    assert "os.path.join" in card.findChildren(type(win.view.empty_text))[0].text()
    assert win.session.busy and win.composer.button.text() == "Stop"
    assert builtin_calls == []  # nothing runs before the user allows it
    assert not any(mw.regen_button.isVisible() for mw in win.view.widgets.values())
    card.buttons["allow"].click()
    wait_idle(qtbot, win)
    assert builtin_calls == [("python_doc", {"name": "os.path.join"})]
    assert roles(win) == ["user", "assistant", "tool", "assistant"]
    msgs = win.conversations.messages(win.conversations.current)
    assert msgs[2].content.startswith("os.path.join(") and not msgs[2].meta["is_error"]
    assert msgs[1].meta["tool_calls"][0]["state"] == "done"
    assert msgs[3].content == FINAL and msgs[3].meta["stats"]["tokens"] > 0
    assert msgs[1].meta["stats"]["tokens"] > 0  # every step streams with its stats
    # the model saw the tool list, and then its call and the result
    first, second = fake.prompts[-2], fake.prompts[-1]
    assert "python_doc" in first[0]["content"] and first[0]["role"] == "system"
    assert "<function=python_doc>" in second[2]["content"]
    assert "<tool_response>\nos.path.join(" in second[3]["content"]
    # the view: the call's card (done), the result's card, the final answer
    assert [c.state for c in cards(win)] == ["done"]
    assert any(isinstance(mw, ToolResultWidget) for mw in win.view.widgets.values())
    assert "<tool_call>" not in win.view.widgets[msgs[1].id].body.block_widgets()[0].text()
    # exported with the chat
    conv = win.conversations.current
    md = win.conversations.export_text(conv, "md")
    assert "**Tool call: python › python_doc** (done)" in md and '"name": "os.path.join"' in md
    assert "**Tool result: python › python_doc**" in md and "<tool_call>" not in md
    data = json.loads(win.conversations.export_text(conv, "json"))
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert data["messages"][1]["meta"]["tool_calls"][0]["arguments"] == {"name": "os.path.join"}


def test_deny_tells_the_model_and_runs_nothing(qtbot, win, fake, builtin_calls):
    win.tools.set_server(builtin.SERVER, True)
    fake.scripts[:] = [DOC_CALL, "I could not look it up."]
    send(qtbot, win, "What does os.path.join do?")
    qtbot.waitUntil(lambda: pending(win) is not None)
    pending(win).buttons["deny"].click()
    wait_idle(qtbot, win)
    assert builtin_calls == []
    msgs = win.conversations.messages(win.conversations.current)
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[2].content == "The user declined to run this tool call." and msgs[2].meta["is_error"]
    assert msgs[1].meta["tool_calls"][0]["state"] == "denied"


def test_always_allow_is_remembered_per_server(qtbot, win, fake, builtin_calls):
    win.tools.set_server(builtin.SERVER, True)
    fake.scripts[:] = [DOC_CALL, FINAL, DOC_CALL, FINAL]
    send(qtbot, win, "What does os.path.join do?")
    qtbot.waitUntil(lambda: pending(win) is not None)
    pending(win).buttons["always"].click()
    wait_idle(qtbot, win)
    assert win.tools.manager.prefs.allows(builtin.SERVER, "python_doc")
    assert win.store.get_setting("tools")["always_allow"] == {"python": ["python_doc"]}
    send(qtbot, win, "And again?")
    wait_idle(qtbot, win)
    assert len(builtin_calls) == 2
    assert roles(win)[-4:] == ["user", "assistant", "tool", "assistant"]


def test_stop_while_a_call_waits_for_approval(qtbot, win, fake, builtin_calls):
    win.tools.set_server(builtin.SERVER, True)
    fake.scripts[:] = [DOC_CALL, FINAL]
    send(qtbot, win, "What does os.path.join do?")
    qtbot.waitUntil(lambda: pending(win) is not None)
    n_prompts = len(fake.prompts)
    win.sending.stop()
    wait_idle(qtbot, win)
    assert builtin_calls == [] and len(fake.prompts) == n_prompts
    assert roles(win) == ["user", "assistant"]
    assert [c.state for c in cards(win)] == ["cancelled"]
    assert win.composer.button.text() == "Send"


def mcp_config(home, **servers) -> None:
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "mcp.json").write_text(json.dumps({"mcpServers": servers}))


@pytest.fixture
def mcp_win(qtbot, tmp_path, home, fake):
    mcp_config(home, t={"command": sys.executable, "args": [str(SCRIPT)]})
    w = make_window(qtbot, tmp_path, fake)
    w.tools.set_server("t", True)
    qtbot.waitUntil(lambda: w.tools.manager.states()["t"].status == "ready", timeout=30000)
    yield w
    w.close()


def test_stop_cancels_a_running_call(qtbot, mcp_win, fake):
    w = mcp_win
    fake.scripts[:] = [call_xml("hang", seconds=30), FINAL]
    send(qtbot, w, "Wait for it")
    qtbot.waitUntil(lambda: pending(w) is not None)
    pending(w).buttons["allow"].click()
    qtbot.waitUntil(lambda: [c.state for c in cards(w)] == ["running"])
    t0 = time.monotonic()
    w.sending.stop()
    wait_idle(qtbot, w)
    assert time.monotonic() - t0 < 2
    assert [c.state for c in cards(w)] == ["cancelled"] and roles(w) == ["user", "assistant"]
    # the server is still usable
    fake.scripts[:] = [call_xml("add", a=2, b=40), "42."]
    send(qtbot, w, "Add")
    qtbot.waitUntil(lambda: pending(w) is not None)
    pending(w).buttons["allow"].click()
    wait_idle(qtbot, w)
    msgs = w.conversations.messages(w.conversations.current)
    assert msgs[-2].role == "tool" and msgs[-2].content == "42"


def test_a_tool_result_cannot_inject_a_call(qtbot, mcp_win, fake):
    w = mcp_win
    fake.scripts[:] = [call_xml("inject"), "The tool said it was done."]
    send(qtbot, w, "Run inject")
    qtbot.waitUntil(lambda: pending(w) is not None)
    pending(w).buttons["allow"].click()
    wait_idle(qtbot, w)
    msgs = w.conversations.messages(w.conversations.current)
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert "<function=add>" in msgs[2].content  # the result holds a call's text ...
    assert not msgs[3].meta.get("tool_calls")   # ... and nothing ran from it
    assert [c.rec["tool"] for c in cards(w)] == ["inject"]
    assert "<function=add>" in fake.prompts[-1][-1]["content"]  # it went back as data


def test_step_bound(qtbot, win, fake, builtin_calls):
    win.tools.manager.set_prefs(win.tools.manager.prefs.with_allowed("python", "python_doc"))
    from dataclasses import replace
    win.tools.manager.set_prefs(replace(win.tools.manager.prefs, max_steps=2))
    win.tools.set_server(builtin.SERVER, True)
    fake.scripts[:] = [DOC_CALL] * 5
    send(qtbot, win, "Loop forever")
    wait_idle(qtbot, win)
    assert len(builtin_calls) == 2
    assert roles(win) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    last = win.conversations.messages(win.conversations.current)[-1]
    assert last.meta["tool_calls"][0]["state"] == "skipped"
    assert "limit of 2 tool steps" in last.meta["tool_note"]


def test_unknown_tool_gets_an_error_result(qtbot, win, fake):
    win.tools.set_server(builtin.SERVER, True)
    fake.scripts[:] = [call_xml("rm_rf", path="/"), "Sorry."]
    send(qtbot, win, "Delete everything")
    wait_idle(qtbot, win)
    msgs = win.conversations.messages(win.conversations.current)
    assert msgs[2].content == "There is no tool named rm_rf." and msgs[2].meta["is_error"]


def test_no_tools_no_parsing(qtbot, win, fake):
    fake.scripts[:] = [DOC_CALL]
    send(qtbot, win, "What does os.path.join do?")
    wait_idle(qtbot, win)
    assert roles(win) == ["user", "assistant"] and not cards(win)
    assert "python_doc" not in json.dumps(fake.prompts[-1])


def test_reopened_chat_shows_cards_and_replays_the_calls(qtbot, tmp_path, home, fake):
    w = make_window(qtbot, tmp_path, fake)
    w.tools.set_server(builtin.SERVER, True)
    fake.scripts[:] = [DOC_CALL, FINAL]
    send(qtbot, w, "What does os.path.join do?")
    qtbot.waitUntil(lambda: pending(w) is not None)
    pending(w).buttons["allow"].click()
    wait_idle(qtbot, w)
    w.close()
    w2 = make_window(qtbot, tmp_path, fake)
    try:
        assert [c.state for c in cards(w2)] == ["done"]
        results = [mw for mw in w2.view.widgets.values() if isinstance(mw, ToolResultWidget)]
        assert len(results) == 1 and "os.path.join" in results[0].box.toggle.text()
        fake.scripts[:] = ["Anything else?"]
        send(qtbot, w2, "Thanks")
        wait_idle(qtbot, w2)
        prompt = fake.prompts[-1]
        assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user",
                                                "assistant", "user"]
        assert "<function=python_doc>" in prompt[2]["content"]
        assert prompt[3]["content"].startswith("<tool_response>\nos.path.join(")
        assert prompt[4]["content"] == FINAL and prompt[5]["content"] == "Thanks"
    finally:
        w2.close()


def test_malformed_mcp_json_is_one_line_and_the_app_starts(qtbot, tmp_path, home, fake):
    (home / "config").mkdir(parents=True)
    (home / "config" / "mcp.json").write_text('{"mcpServers": {"x": {"args": 3}}')
    w = make_window(qtbot, tmp_path, fake)
    try:
        err = w.tools.manager.config_error
        assert err and "\n" not in err and "mcp.json is not valid" in err
        assert w.tools.notice.isVisible() and w.tools.notice.text() == f"⚠ {err}"
        send(qtbot, w, "Hello")
        assert roles(w) == ["user", "assistant"]
        dlg = w.tools.show_dialog()
        assert err in dlg.details.text() or dlg.server_list.count() == 1
        dlg.close()
    finally:
        w.close()


def test_hung_tool_times_out_and_the_reply_goes_on(qtbot, mcp_win, fake):
    from dataclasses import replace
    w = mcp_win
    w.tools.manager.set_prefs(replace(w.tools.manager.prefs, timeout_s=1.0))
    fake.scripts[:] = [call_xml("hang", seconds=30), "It took too long."]
    send(qtbot, w, "Wait")
    qtbot.waitUntil(lambda: pending(w) is not None)
    pending(w).buttons["allow"].click()
    wait_idle(qtbot, w, timeout=15000)
    msgs = w.conversations.messages(w.conversations.current)
    assert msgs[2].content == "The tool hang did not answer within 1 s." and msgs[2].meta["is_error"]
    assert msgs[3].content == "It took too long."


def test_crashed_server_shows_stderr_and_restarts_from_the_window(qtbot, mcp_win, fake):
    w = mcp_win
    fake.scripts[:] = [call_xml("crash"), "The server crashed."]
    send(qtbot, w, "Crash it")
    qtbot.waitUntil(lambda: pending(w) is not None)
    pending(w).buttons["allow"].click()
    wait_idle(qtbot, w)
    msgs = w.conversations.messages(w.conversations.current)
    assert "the test server crashed on purpose" in msgs[2].content
    dlg = w.tools.show_dialog()
    qtbot.waitUntil(lambda: w.tools.manager.states()["t"].status == "error")
    dlg.server_list.setCurrentRow(1)
    qtbot.waitUntil(lambda: "fatal: the test server crashed on purpose" in dlg.details.text())
    dlg.restart_button.click()
    qtbot.waitUntil(lambda: w.tools.manager.states()["t"].status == "ready", timeout=30000)
    qtbot.waitUntil(lambda: "running" in dlg.server_list.item(1).text())
    dlg.close()


def test_settings_json_editor_validates_and_saves(qtbot, win, home):
    dlg = win.tools.show_dialog()
    dlg.editor.setPlainText('{"mcpServers": {"x": {"command": 5}}}')
    assert not dlg.save_button.isEnabled() and "mcpServers.x" in dlg.json_status.text()
    dlg.editor.setPlainText('{"mcpServers": {}}')
    dlg.add_filesystem([str(home)])
    data = json.loads(dlg.editor.toPlainText())
    data["mcpServers"]["filesystem"]["disabled"] = True  # (not started by this test)
    dlg.editor.setPlainText(json.dumps(data))
    assert dlg.save_button.isEnabled()
    dlg.save_button.click()
    saved = json.loads((home / "config" / "mcp.json").read_text())
    assert saved["mcpServers"]["filesystem"]["args"][-1] == str(home.resolve())
    assert "filesystem" in win.tools.manager.specs
    assert win.tools.manager.states()["filesystem"].status == "disabled"
    dlg.close()


def test_another_chat_says_a_call_waits_and_esc_stops_it(qtbot, win, fake, builtin_calls):
    win.tools.set_server(builtin.SERVER, True)
    fake.scripts[:] = [DOC_CALL, FINAL]
    send(qtbot, win, "What does os.path.join do?")
    qtbot.waitUntil(lambda: pending(win) is not None)
    first = win.conversations.current
    win.chats.new_chat()
    assert win.conversations.current != first
    assert "waits for your answer to a tool call" in win.composer.hint.text()
    win.sending.on_escape()
    wait_idle(qtbot, win)
    assert builtin_calls == [] and not win.composer.hint.text()
    assert win.conversations.message(
        win.conversations.messages(first)[1].id).meta["tool_calls"][0]["state"] == "cancelled"


def test_a_call_being_written_shows_a_line_not_markup(qtbot):
    from app.chat.message_widget import MessageWidget

    w = MessageWidget(1, "assistant")
    qtbot.addWidget(w)
    w.update_content("Let me check.\n\n<tool_call>\n<function=python_doc>\n<param", {},
                     final=False)
    assert w.tool_panel.note.text() == "Writing a tool call…"
    assert "tool_call" not in w.body.block_widgets()[0].text()
    w.update_content(DOC_CALL, {"tool_calls": [{"id": "c", "name": "python_doc", "server":
                                                "python", "tool": "python_doc", "arguments":
                                                {"name": "os.path.join"}, "state": "done"}]},
                     final=True)
    assert not w.tool_panel.note.text() and [c.state for c in w.tool_panel.cards] == ["done"]


def test_the_tool_example_switches_python_doc_on_and_still_asks_first(qtbot, win, fake,
                                                                      builtin_calls):
    """The demo's empty chat offers an example that needs the built-in tool: clicking it
    switches python_doc on for this chat (the Tools chip says so) and sends the question; the
    call still waits for Allow."""
    from app.chat.main_window import DEMO_TOOL_EXAMPLES, DEMO_TOOL_INTRO

    win.view.set_examples("Try:", ["Explain str.split."], tool_prompts=list(DEMO_TOOL_EXAMPLES),
                          tool_intro=DEMO_TOOL_INTRO)
    buttons = win.view.example_buttons
    assert len(buttons) == 2 and buttons[1].text().endswith("(with a tool)")
    assert "`" not in buttons[1].text()
    assert win.tools.button.text() == "Tools"
    fake.scripts[:] = [call_xml("python_doc", name="zipfile.is_zipfile"), FINAL]
    buttons[1].click()
    qtbot.waitUntil(lambda: pending(win) is not None)
    assert win.tools.button.text() == "Tools (1)" and win.tools.button.isChecked()
    assert win.conversations.messages(win.conversations.current)[0].content == \
        DEMO_TOOL_EXAMPLES[0]
    assert builtin_calls == []
    pending(win).buttons["allow"].click()
    wait_idle(qtbot, win)
    assert builtin_calls == [("python_doc", {"name": "zipfile.is_zipfile"})]
    assert roles(win) == ["user", "assistant", "tool", "assistant"]
    # the examples of a model that is not the demo: none with a tool
    from types import SimpleNamespace

    from app.chat.main_window import _tool_examples_for
    assert _tool_examples_for(SimpleNamespace(path="/nowhere")) == {}
