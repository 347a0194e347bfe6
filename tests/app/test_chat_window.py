"""The main chat window over the scripted fake engine: streaming, stop, errors, chat switch,
edit/regenerate, persistence across a restart, search, delete/undo, export, keyboard."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt

from app.db import ChatStore
from app.fake.engine import DEFAULT_SCRIPT, FakeModel
from tests.app.chat_fixtures import make_window, send

pytestmark = pytest.mark.gui


@pytest.fixture
def fake():
    return FakeModel(tokens_per_second=20000)


@pytest.fixture
def win(qtbot, tmp_path, fake):
    w = make_window(qtbot, tmp_path, fake)
    yield w
    w.close()


def _assistant(w, conv=None):
    return [m for m in w.store.messages(conv or w.current_conv) if m.role == "assistant"]


def test_reply_streams_renders_and_persists(qtbot, win):
    send(qtbot, win, "Show me fib")
    msgs = win.store.messages(win.current_conv)
    assert [m.role for m in msgs] == ["user", "assistant"]
    reply = msgs[1]
    assert reply.content == DEFAULT_SCRIPT
    assert reply.meta["status"] == "done" and reply.meta["stats"]["tokens"] > 0
    assert reply.meta["draft_spans"]  # the fake accepted drafts, so some text is tinted
    widget = win.view.widgets[reply.id]
    assert widget.content == DEFAULT_SCRIPT
    assert "tok/s" in widget.stats_label.text() and "first token" in widget.stats_label.text()
    code = [b for b in widget.body.block_widgets() if type(b).__name__ == "CodeBlock"]
    assert len(code) == 1 and code[0].lang == "python" and "def fib" in code[0].code
    assert win.store.conversation(win.current_conv).title == "Show me fib"
    assert win.composer.text == ""


def test_streaming_updates_only_the_tail(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=300))
    send(qtbot, w, "go")
    body = w.view.widgets[_assistant(w)[0].id].body
    # every stable block is rendered exactly once; only tail updates are re-rendered
    assert len(body.stable_widgets) == 4
    assert body.renders < 4 + 60
    w.close()


def test_copy_buttons(qtbot, win):
    from PySide6.QtGui import QGuiApplication

    send(qtbot, win, "x")
    widget = win.view.widgets[_assistant(win)[0].id]
    widget.copy_button.click()
    assert QGuiApplication.clipboard().text() == DEFAULT_SCRIPT.strip()
    code = next(b for b in widget.body.block_widgets() if type(b).__name__ == "CodeBlock")
    code.copy_button.click()
    assert QGuiApplication.clipboard().text().startswith("def fib(n: int)")
    win.chats.copy_chat()
    whole = QGuiApplication.clipboard().text()
    assert whole.startswith("# x\n") and "## User\n\nx" in whole and "def fib" in whole


def test_stop_mid_stream_keeps_partial_reply_and_drops_stale_deltas(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=200, repeat_to=3000)
    w = make_window(qtbot, tmp_path, fake)
    send(qtbot, w, "long please", wait=False)
    rid = next(iter(w.session.streams))
    stream = w.session.streams[rid]
    qtbot.waitUntil(lambda: bool(stream.content), timeout=5000)
    assert w.composer.button.text() == "Stop"
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Escape)
    # a late delta of the stopped request is dropped, whether or not it has finished yet
    before = stream.content + "".join(stream.pending)
    w.session.on_delta(rid, "STALE", [1], [False])
    assert stream.content + "".join(stream.pending) == before
    assert w.session.dropped_deltas >= 1
    qtbot.waitUntil(lambda: not w.session.streams, timeout=5000)
    reply = _assistant(w)[0]
    assert reply.meta["status"] == "cancelled" and reply.meta["finish_reason"] == "cancelled"
    assert 0 < len(reply.content) < len(DEFAULT_SCRIPT) * 20
    assert "STALE" not in reply.content
    assert "stopped" in w.view.widgets[reply.id].stats_label.text()
    assert w.composer.button.text() == "Send"
    w.close()


def test_unknown_request_deltas_are_dropped(qtbot, win):
    win.session.on_delta(999, "ghost", [1], [True])
    assert win.session.dropped_deltas == 1 and not win.session.streams


def test_engine_error_shows_in_the_reply_and_app_keeps_working(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=20000, fail_after=10, error=RuntimeError("kaput"))
    w = make_window(qtbot, tmp_path, fake)
    send(qtbot, w, "break")
    reply = _assistant(w)[0]
    assert reply.meta["status"] == "error"
    assert reply.meta["error"] == "Internal error: RuntimeError: kaput"
    widget = w.view.widgets[reply.id]
    assert "kaput" in widget.error_label.text() and widget.error_label.isVisibleTo(widget)
    fake.fail_after = None
    send(qtbot, w, "again")
    assert _assistant(w)[-1].meta["status"] == "done"
    w.close()


def test_switching_chats_mid_stream_keeps_the_reply_in_its_chat(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=150)
    w = make_window(qtbot, tmp_path, fake)
    conv_a = w.current_conv
    send(qtbot, w, "A question", wait=False)
    qtbot.waitUntil(lambda: any(s.content for s in w.session.streams.values()), timeout=5000)
    w.chats.new_chat()
    conv_b = w.current_conv
    assert conv_b != conv_a
    assert not w.composer.button.isEnabled()
    assert "A question" in w.composer.hint.text()
    # back to A while it is still streaming: the live reply is shown and keeps growing
    w.chats.open_conversation(conv_a)
    live = next(iter(w.session.streams.values()))
    widget = w.view.widgets[live.msg_id]
    qtbot.waitUntil(lambda: len(widget.content) > 40, timeout=5000)
    w.chats.open_conversation(conv_b)
    qtbot.waitUntil(lambda: not w.session.streams, timeout=15000)
    assert [m.content for m in _assistant(w, conv_a)] == [DEFAULT_SCRIPT]
    assert w.store.messages(conv_b) == []
    assert w.view.conv_id == conv_b and not w.view.widgets
    w.chats.open_conversation(conv_a)
    assert [x.content for x in w.view.widgets.values()][-1] == DEFAULT_SCRIPT
    w.close()


def test_reply_is_flushed_while_streaming(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=150, repeat_to=2000))
    send(qtbot, w, "slow", wait=False)
    msg_id = next(iter(w.session.streams.values())).msg_id
    other = ChatStore(w.store.path)
    try:
        qtbot.waitUntil(lambda: len(other.message(msg_id).content) > 20, timeout=5000)
        assert other.message(msg_id).meta["status"] == "streaming"
    finally:
        other.close()
    w.sending.stop()
    qtbot.waitUntil(lambda: not w.session.streams, timeout=5000)
    w.close()


def test_regenerate_shows_a_new_version_of_the_last_reply(qtbot, win, fake):
    send(qtbot, win, "first")
    old = _assistant(win)[0]
    fake.script = "A different answer."
    widget = win.view.widgets[old.id]
    assert widget.regen_button.isVisibleTo(widget) and widget.regen_button.isEnabled()
    widget.regen_button.click()
    qtbot.waitUntil(lambda: not win.session.streams, timeout=5000)
    msgs = win.store.messages(win.current_conv)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].id != old.id and msgs[1].content == "A different answer."


def test_edit_and_resend_starts_a_new_version_keeping_the_old_one(qtbot, win, fake):
    send(qtbot, win, "question one")
    send(qtbot, win, "question two")
    first_user = win.store.messages(win.current_conv)[0]
    asked = []
    win.dialogs.confirm = lambda title, text: asked.append(text) or False
    win.view.widgets[first_user.id].edit_button.click()
    assert win.composer.editing_msg_id == first_user.id
    assert win.composer.text == "question one"
    win.composer.edit.setPlainText("question one, edited")
    fake.script = "Edited answer."
    win.composer.button.click()
    qtbot.waitUntil(lambda: not win.session.streams, timeout=5000)
    assert not asked  # nothing is lost, so nothing to confirm
    msgs = win.store.messages(win.current_conv)
    assert [(m.role, m.content) for m in msgs] == [("user", "question one, edited"),
                                                   ("assistant", "Edited answer.")]
    assert len(win.store.all_messages(win.current_conv)) == 6  # the old branch is kept
    assert win.composer.editing_msg_id is None
    # what the model saw: only the edited message
    assert fake.calls[-1]["prompt_ids"] == win.worker._model.chat_ids(
        [{"role": "user", "content": "question one, edited"}])


def test_history_sent_to_the_model_includes_system_prompt_and_strips_thinking(qtbot, win, fake):
    from dataclasses import replace

    settings = replace(win.session.settings_for(win.current_conv), system_prompt="Be terse.")
    win.store.set_conversation_settings(win.current_conv, settings.to_dict())
    fake.script = "<think>secret plan</think>\n\nVisible answer."
    send(qtbot, win, "hi")
    fake.script = "ok"
    send(qtbot, win, "again")
    history = win.session.history(win.current_conv, settings)
    assert history[0] == {"role": "system", "content": "Be terse."}
    assert {"role": "assistant", "content": "Visible answer."} in history
    assert all("secret plan" not in m["content"] for m in history)


def test_think_card(qtbot, win, fake):
    fake.think = True
    send(qtbot, win, "think first")
    reply = _assistant(win)[0]
    assert reply.content.startswith("<think>") and isinstance(reply.meta.get("think_s"), float)
    card = win.view.widgets[reply.id].think
    assert card is not None
    assert card.toggle.text().startswith("Thought for")
    assert not card.toggle.isChecked()  # collapsed once the thinking is done
    card.toggle.click()
    assert card.flow.isVisibleTo(card)
    assert "<think>" not in win.view.widgets[reply.id].body.block_widgets()[0].text()


def test_empty_think_block_shows_no_card(qtbot, win, fake):
    # Qwen's "thinking off" form: the reply opens with an empty, closed think block.
    fake.script = "<think>\n\n</think>\n\nStraight to the answer."
    send(qtbot, win, "no thinking")
    widget = win.view.widgets[_assistant(win)[0].id]
    assert widget.think is None or not widget.think.isVisibleTo(widget)
    assert "Straight to the answer." in widget.body.block_widgets()[0].text()


def test_persistence_across_a_restart(qtbot, tmp_path, fake):
    w1 = make_window(qtbot, tmp_path, fake)
    send(qtbot, w1, "remember me")
    conv = w1.current_conv
    w1.close()
    w2 = make_window(qtbot, tmp_path, fake)
    assert w2.current_conv == conv
    assert w2.sidebar.ids() == [conv]
    shown = [(x.role, x.content) for x in w2.view.widgets.values()]
    assert shown == [("user", "remember me"), ("assistant", DEFAULT_SCRIPT)]
    w2.close()


def test_reply_interrupted_by_quitting_is_kept(qtbot, tmp_path):
    w1 = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=200, repeat_to=3000))
    send(qtbot, w1, "long", wait=False)
    qtbot.waitUntil(lambda: any(len(s.content) > 30 for s in w1.session.streams.values()),
                    timeout=5000)
    w1.close()
    w2 = make_window(qtbot, tmp_path)
    reply = _assistant(w2)[0]
    assert reply.meta["status"] == "interrupted" and len(reply.content) > 30
    assert "Interrupted" in w2.view.widgets[reply.id].stats_label.text()
    w2.close()


def test_search_filters_the_sidebar(qtbot, win):
    send(qtbot, win, "tell me about penguins")
    conv_a = win.current_conv
    win.chats.new_chat()
    send(qtbot, win, "and now giraffes")
    conv_b = win.current_conv
    assert win.sidebar.ids() == [conv_b, conv_a]
    win.chats.focus_search()
    qtbot.keyClicks(win.sidebar.search, "PENGUIN")
    qtbot.waitUntil(lambda: win.sidebar.ids() == [conv_a], timeout=3000)
    win.sidebar.search.setText("fib(10)")  # text of the replies, in both chats
    qtbot.waitUntil(lambda: win.sidebar.ids() == [conv_b, conv_a], timeout=3000)
    win.sidebar.search.clear()
    qtbot.waitUntil(lambda: len(win.sidebar.ids()) == 2, timeout=3000)


def test_delete_with_undo(qtbot, win):
    send(qtbot, win, "keep this")
    doomed = win.current_conv
    win.chats.new_chat()
    send(qtbot, win, "second")
    other = win.current_conv
    win.chats.delete_conversation(doomed)
    assert win.sidebar.ids() == [other]
    assert win.sidebar.undo_bar.isVisibleTo(win.sidebar)
    win.sidebar.undo_button.click()
    assert set(win.sidebar.ids()) == {doomed, other} and win.current_conv == doomed
    assert [m.content for m in win.store.messages(doomed)][0] == "keep this"
    # deleting the open chat moves to another; a second deletion makes the first final
    win.chats.delete_conversation(doomed)
    assert win.current_conv == other
    win.chats.delete_conversation(other)  # the last one: a fresh empty chat takes its place
    assert other not in win.sidebar.ids() and len(win.sidebar.ids()) == 1
    win.chats.undo_delete()
    assert other in win.sidebar.ids() and doomed not in win.sidebar.ids()
    assert win.store.messages(doomed) == []


def test_delete_key_in_the_list(qtbot, win):
    send(qtbot, win, "bye")
    conv = win.current_conv
    win.sidebar.list.setFocus()
    win.sidebar.select(conv)
    qtbot.keyClick(win.sidebar.list, Qt.Key.Key_Delete)
    assert conv not in win.sidebar.ids()
    win.chats.undo_delete()
    assert conv in win.sidebar.ids()


def test_rename(qtbot, win):
    send(qtbot, win, "x")
    win.chats.rename_conversation(win.current_conv, "My title")
    assert win.sidebar.list.item(0).text().startswith("My title")


def test_export_markdown_and_json(qtbot, win, tmp_path):
    send(qtbot, win, "export me")
    md = win.chats.export_conversation(win.current_conv, "md", tmp_path / "c.md").read_text("utf-8")
    assert md.startswith("# export me") and "## Assistant" in md and "def fib" in md
    data = json.loads(win.chats.export_conversation(win.current_conv, "json", tmp_path / "c.json")
                      .read_text("utf-8"))
    assert [m["content"] for m in data["messages"]] == ["export me", DEFAULT_SCRIPT]


def test_enter_sends_and_shift_enter_adds_a_newline(qtbot, win):
    qtbot.keyClicks(win.composer.edit, "line one")
    qtbot.keyClick(win.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(win.composer.edit, "line two")
    assert win.composer.text == "line one\nline two"
    assert win.store.messages(win.current_conv) == []
    qtbot.keyClick(win.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not win.session.streams, timeout=5000)
    assert win.store.messages(win.current_conv)[0].content == "line one\nline two"


def test_send_is_disabled_for_empty_text_and_while_loading(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, wait_loaded=False)
    w.composer.edit.setPlainText("hello")
    qtbot.waitUntil(lambda: w.model.info is not None, timeout=5000)
    assert w.composer.button.isEnabled()
    w.composer.edit.setPlainText("   ")
    assert not w.composer.button.isEnabled()
    w.close()


def test_missing_demo_model_shows_a_message_not_a_crash(qtbot, tmp_path, monkeypatch):
    from app.chat.main_window import MainWindow

    monkeypatch.setenv("MTPCHAT_RESOURCES", str(tmp_path / "no-resources"))
    w = MainWindow(db_file=tmp_path / "db.sqlite")
    qtbot.addWidget(w)
    assert w.banner.isVisibleTo(w) and "demo model is missing" in w.banner.text()
    assert not w.composer.button.isEnabled()
    assert "No model" in w.composer.hint.text()
    w.close()


def test_load_failure_is_reported(qtbot, tmp_path):
    from app.chat.main_window import MainWindow
    from engine.errors import UnsupportedModelError

    def loader(path):
        raise UnsupportedModelError("Architecture 'llama' is not supported.")

    (tmp_path / "m").mkdir()
    w = MainWindow(model_path=str(tmp_path / "m"), loader=loader, db_file=tmp_path / "db")
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.banner.isVisibleTo(w), timeout=5000)
    assert w.banner.text() == "Architecture 'llama' is not supported."
    assert w.picker.status.text() == "Not loaded"
    w.close()


def test_model_capabilities_drive_the_settings(qtbot, tmp_path):
    from app.fake.engine import fake_model_info

    fake = FakeModel()
    fake.info = fake_model_info(supports_thinking=False, has_mtp=False)
    w = make_window(qtbot, tmp_path, fake)
    form = w.settings_panel.form
    assert not form.thinking.isEnabled() and not form.depth.isEnabled()
    assert "no MTP" in w.picker.badge.text()
    send(qtbot, w, "hi")
    assert fake.calls[-1]["depth"] == 0
    w.close()


def test_per_chat_settings_are_saved_and_used(qtbot, win, fake):
    win.settings_button.click()
    form = win.settings_panel.form
    form.max_tokens.setValue(16)
    form.depth.setCurrentIndex(form.depth.findData(2))
    form.temperature.setValue(0.0)
    saved = win.store.conversation(win.current_conv).settings
    assert saved["max_tokens"] == 16 and saved["depth"] == 2 and saved["temperature"] == 0.0
    send(qtbot, win, "short")
    call = fake.calls[-1]
    assert call["max_tokens"] == 16 and call["depth"] == 2 and call["sampling"].greedy
    assert _assistant(win)[0].meta["finish_reason"] == "length"


def test_show_speculation_tints_drafted_text(qtbot, win):
    send(qtbot, win, "tint")
    win.tint_action.trigger()
    widget = win.view.widgets[_assistant(win)[0].id]
    first = widget.body.block_widgets()[0]
    assert "background-color" in first.text()
    win.tint_action.trigger()
    widget = win.view.widgets[_assistant(win)[0].id]
    assert "background-color" not in widget.body.block_widgets()[0].text()


def test_dark_theme_restyles(qtbot, win):
    from app.chat.settings_dialog import AppPreferences
    from app.chat.theme import palette_is_dark

    send(qtbot, win, "x")
    win.apply_preferences(AppPreferences(theme="dark"))
    assert palette_is_dark()
    assert "monokai" not in win.styleSheet()  # the sheet is ours, code colours come from Pygments
    win.apply_preferences(AppPreferences(theme="light"))
    assert not palette_is_dark()


def test_view_menu_opens_the_other_windows(qtbot, win):
    dash, models = win.aux.show_dashboard(), win.aux.show_models()
    assert dash.isVisible() and models.isVisible()
    assert win.aux.show_dashboard() is dash and win.aux.show_models() is models  # made once
    assert dash.info is win.model.info and models.installed_panel.loaded_path == win.model.info.path
    dash.close()
    models.close()


def test_tuning_is_wired_to_the_dashboard_and_models_window(qtbot, win, monkeypatch):
    from engine.depth import tuner

    def fake_tune(model, *, depths, progress, cancel):
        progress(1, 2, "depth 0")
        progress(2, 2, "depth 1")
        return {"best_depth": 1}

    monkeypatch.setattr(tuner, "tune", fake_tune)
    dash, models = win.aux.show_dashboard(), win.aux.show_models()
    seen = []
    monkeypatch.setattr(dash, "on_tune_progress", lambda d, t, m: seen.append(("dash", d, t, m)))
    monkeypatch.setattr(models, "on_tune_progress", lambda d, t, m: seen.append(("models", d, t, m)))
    models.tune_requested.emit("")
    qtbot.waitUntil(lambda: len([e for e in seen if e[2]]) == 4, timeout=5000)
    assert ("dash", 2, 2, "depth 1") in seen and ("models", 2, 2, "depth 1") in seen
    assert seen[0] == ("dash", 0, 0, "Starting…")  # shown running from the first moment
    qtbot.waitUntil(lambda: models.installed_panel.tune_status.text().startswith("Tuning done"),
                    timeout=5000)
    monkeypatch.undo()
    models.on_tune_progress(2, 2, "depth 1")
    assert models.installed_panel.tune_status.text() == "Tuning 2/2: depth 1"
    dash.close()
    models.close()


def test_controls_have_accessible_names(qtbot, win):
    from PySide6.QtWidgets import (
        QAbstractButton,
        QAbstractSpinBox,
        QComboBox,
        QLineEdit,
        QListWidget,
        QPlainTextEdit,
        QWidget,
    )

    send(qtbot, win, "hello")
    win.settings_button.click()
    kinds = (QAbstractButton, QLineEdit, QPlainTextEdit, QComboBox, QListWidget, QAbstractSpinBox)
    unnamed = []
    for w in win.findChildren(QWidget):
        if not isinstance(w, kinds) or not w.isVisibleTo(win):
            continue
        if isinstance(w, QLineEdit) and isinstance(w.parent(), (QAbstractSpinBox, QComboBox)):
            continue  # the editor inside a spin box or combo box carries its parent's name
        if not (w.accessibleName() or (isinstance(w, QAbstractButton) and w.text())):
            unnamed.append(f"{type(w).__name__}:{w.objectName()}")
    assert unnamed == []


def test_signals_queued_after_close_are_ignored(qtbot, tmp_path):
    """Quitting while the model loads: its 'loaded' arrives after the database is closed."""
    from app.chat.main_window import MainWindow
    from app.fake.engine import make_fake_loader

    (tmp_path / "m").mkdir()
    w = MainWindow(model_path=str(tmp_path / "m"), db_file=tmp_path / "db",
                   loader=make_fake_loader(FakeModel(), delay=0.3))
    qtbot.addWidget(w)
    w.close()  # waits for the load, whose signals are then still queued
    qtbot.wait(100)  # deliver them: nothing may touch the closed store
    assert w.session.closed


def test_demo_model_offers_example_prompts(qtbot, win, tmp_path):
    from types import SimpleNamespace

    from app.chat.main_window import DEMO_EXAMPLES, _examples_for
    from app.chat.markdown import plain_inline
    from app.paths import default_model_path

    assert win.view.example_buttons == []  # the (fake) loaded model is not the demo
    assert _examples_for(SimpleNamespace(path=str(tmp_path))) == ("", [])
    intro, prompts = _examples_for(SimpleNamespace(path=str(default_model_path())))
    assert "standard-library" in intro and prompts == list(DEMO_EXAMPLES)
    win.view.set_examples(intro, prompts)
    assert [b.text() for b in win.view.example_buttons] == [plain_inline(p) for p in DEMO_EXAMPLES]
    assert win.view.empty_label.isVisibleTo(win.view)
    win.view.example_buttons[0].click()  # sends it, like typing it and pressing Send
    qtbot.waitUntil(lambda: not win.session.streams, timeout=10000)
    users = [m.content for m in win.store.messages(win.current_conv) if m.role == "user"]
    assert users == [DEMO_EXAMPLES[0]]
    assert not win.view.empty_label.isVisibleTo(win.view)
