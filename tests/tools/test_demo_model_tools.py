"""The tool loop's prompts on the real engine: the embedded demo model (its template knows no
tools, so the Qwen3.5 layout is written out, as the server does) through the real worker. The
5.3M-parameter demo model does not call tools itself; its replies to a chat with tools and to
a step after a tool result must still stream and finish, over the longer prompts."""
from __future__ import annotations

import re

import pytest

from app.tools import builtin
from engine.resources import default_model_path

pytestmark = [pytest.mark.gui, pytest.mark.slow]  # about 30 s: loads the demo model


def test_demo_model_with_tools_and_after_a_tool_result(qtbot, tmp_path, monkeypatch):
    from dataclasses import replace

    from app.chat.main_window import MainWindow

    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    w = MainWindow(model_path=str(default_model_path()), db_file=tmp_path / "db.sqlite")
    qtbot.addWidget(w)
    try:
        qtbot.waitUntil(lambda: w.model.info is not None, timeout=120_000)
        conv = w.current_conv
        settings = replace(w.session.settings_for(conv), max_tokens=16, temperature=0.0)
        w.conversations.set_settings(conv, settings)

        from tests.tools.test_tool_loop import pending

        def reply_to(text: str):
            w.composer.edit.setPlainText(text)
            w.composer.button.click()
            qtbot.waitUntil(lambda: not w.session.busy or pending(w) is not None,
                            timeout=120_000)
            first = [m for m in w.store.messages(conv) if m.role == "assistant"][-1]
            if pending(w) is not None:  # the demo calls python_doc when it is offered
                pending(w).buttons["deny"].click()
                qtbot.waitUntil(lambda: not w.session.busy, timeout=120_000)
            return first

        plain = reply_to("What does os.path.join do?")
        w.tools.set_server(builtin.SERVER, True)
        with_tools = reply_to("What does os.path.join do?")
        for r in (plain, with_tools):
            assert r.meta["status"] == "done" and r.meta["stats"]["tokens"] >= 1, r.meta
        # the tool list went into the prompt (its section is a few hundred tokens)
        assert with_tools.meta["stats"]["prompt_tokens"] > plain.meta["stats"]["prompt_tokens"] + 100
        # a step that called python_doc, its result, and the demo model's next step
        call = {"id": "c1", "name": "python_doc", "server": "python", "tool": "python_doc",
                "arguments": {"name": "os.path.join"}, "state": "done"}
        w.store.add_message(conv, "user", "And with a tool?")
        w.store.add_message(conv, "assistant", "<tool_call>\n<function=python_doc>\n"
                            "<parameter=name>\nos.path.join\n</parameter>\n</function>\n"
                            "</tool_call>", meta={"status": "done", "tool_calls": [call]})
        doc, _ = builtin.call_builtin("python_doc", {"name": "os.path.join"})
        w.store.add_message(conv, "tool", doc, meta={"tool_call_id": "c1", "name": "python_doc",
                                                     "server": "python", "is_error": False})
        assert w.session.continue_reply(conv) is not None
        qtbot.waitUntil(lambda: not w.session.busy, timeout=120_000)
        step = w.store.messages(conv)[-1]
        assert step.role == "assistant" and step.meta["status"] == "done", step.meta
        assert step.meta["stats"]["prompt_tokens"] > with_tools.meta["stats"]["prompt_tokens"]
    finally:
        w.close()


def test_first_launch_the_demo_calls_python_doc_for_a_name_it_never_saw(qtbot, tmp_path,
                                                                          monkeypatch):
    from dataclasses import replace

    from app.chat.main_window import DEMO_TOOL_EXAMPLES, MainWindow
    from tests.tools.test_tool_loop import pending, roles

    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    ran = []
    real = builtin.call_builtin
    monkeypatch.setattr(builtin, "call_builtin", lambda t, a: ran.append(a) or real(t, a))
    w = MainWindow(model_path=str(default_model_path()), db_file=tmp_path / "db.sqlite")
    qtbot.addWidget(w)
    try:
        qtbot.waitUntil(lambda: w.model.info is not None, timeout=120_000)
        conv = w.current_conv
        w.conversations.set_settings(conv, replace(w.session.settings_for(conv),
                                                   temperature=0.0))
        name = re.search(r"`([\w.]+)`", DEMO_TOOL_EXAMPLES[0]).group(1)
        tool_button = next(b for b in w.view.example_buttons if b.text().endswith("tool)"))
        tool_button.click()
        qtbot.waitUntil(lambda: pending(w) is not None, timeout=120_000)
        assert ran == []  # nothing runs before Allow
        call = w.store.messages(conv)[1].meta["tool_calls"][0]
        assert (call["name"], call["arguments"]) == ("python_doc", {"name": name})
        pending(w).buttons["allow"].click()
        qtbot.waitUntil(lambda: not w.session.busy and not w.session.streams, timeout=120_000)
        assert ran == [{"name": name}]
        assert roles(w) == ["user", "assistant", "tool", "assistant"]
        msgs = w.store.messages(conv)
        signature = builtin.python_doc(name).splitlines()[0]
        assert msgs[3].content.startswith(f"`{signature}`\n\n"), msgs[3].content
        assert builtin.python_doc(name).split("\n\n")[1] in msgs[3].content  # copied
        assert msgs[3].meta["status"] == "done" and msgs[3].meta["stats"]["tokens"] > 5
    finally:
        w.close()
