"""Issue 16 features: system prompt presets, the per-chat thinking switch, the last used
model loaded at start, attachments (chips, prompt, database, context warning) and long
conversations (say so before sending; offer to leave the oldest turns out)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from app.fake.engine import FakeModel, fake_model_info
from tests.app.chat_fixtures import make_window, send

pytestmark = pytest.mark.gui


@pytest.fixture
def fake():
    return FakeModel(tokens_per_second=20000, script="Fine.")


@pytest.fixture
def win(qtbot, tmp_path, fake):
    w = make_window(qtbot, tmp_path, fake)
    yield w
    w.close()


def test_presets_are_saved_and_picked_per_chat(qtbot, win, fake, tmp_path):
    panel = win.settings_panel
    panel.form.system_prompt.setPlainText("You are a pirate.")
    panel.preset_saved.emit("Pirate", "You are a pirate.")
    assert win.store.presets() == [("Pirate", "You are a pirate.")]
    assert panel.preset.currentText() == "Pirate"
    send(qtbot, win, "hello")
    first = win.current_conv
    win.chats.new_chat()
    send(qtbot, win, "hello")  # a new chat: no system prompt
    second = win.current_conv
    assert win.conversations.settings_for(second).system_prompt == ""
    assert panel.preset.currentText() == "Default"  # a new chat has the default settings
    panel.preset.setCurrentIndex(panel.preset.findData("Pirate"))
    panel.preset.activated.emit(panel.preset.currentIndex())
    assert win.conversations.settings_for(second).system_prompt == "You are a pirate."
    assert win.conversations.settings_for(first).system_prompt == "You are a pirate."
    send(qtbot, win, "again")
    sent = "".join(chr(i) for i in fake.calls[-1]["prompt_ids"])
    assert sent.startswith("<|system|>You are a pirate.\n")
    win.close()
    w2 = make_window(qtbot, tmp_path, fake)  # presets survive a restart
    assert w2.settings_panel.presets == {"Pirate": "You are a pirate."}
    w2.chat_settings.delete_preset("Pirate")
    assert w2.store.presets() == []
    w2.close()


def test_thinking_switch_per_chat(qtbot, win, fake):
    button = win.composer.think_button
    assert button.isEnabled()  # the fake's template has the switch
    assert not button.isChecked()
    button.click()
    assert win.conversations.settings_for(win.current_conv).thinking
    assert win.settings_panel.form.thinking.isChecked()
    send(qtbot, win, "think please")
    reply = [m for m in win.store.messages(win.current_conv) if m.role == "assistant"][-1]
    assert reply.content.startswith("<think>")
    win.chats.new_chat()
    assert not button.isChecked()  # per chat


def test_thinking_switch_disabled_without_template_support(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=20000, info=fake_model_info(supports_thinking=False))
    w = make_window(qtbot, tmp_path, fake)
    assert not w.composer.think_button.isEnabled()
    w.close()


def test_the_last_used_model_is_loaded_at_start(qtbot, tmp_path, fake):
    from app.chat.main_window import MainWindow
    from app.fake.engine import make_fake_loader

    w = make_window(qtbot, tmp_path, fake)
    loaded = w.model.info.path
    w.close()
    w2 = MainWindow(loader=make_fake_loader(fake), db_file=tmp_path / "chats.db")
    qtbot.addWidget(w2)
    qtbot.waitUntil(lambda: w2.model.info is not None, timeout=5000)
    assert w2.model.info.path == loaded
    w2.close()


def test_attachments_show_as_chips_go_into_the_prompt_and_persist(qtbot, win, fake, tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\nThe answer is 42.\n", encoding="utf-8")
    code = tmp_path / "tool.py"
    code.write_text("print('hi')\n", encoding="utf-8")
    win.composer.attach_paths([str(doc), str(code)])
    assert [a.name for a in win.composer.attachments] == ["notes.md", "tool.py"]
    assert len(win.composer._chips) == 2 and win.composer._chips[0].text().startswith("notes.md")
    send(qtbot, win, "What is the answer?")
    assert win.composer.attachments == []
    user = win.store.messages(win.current_conv)[0]
    chips = win.view.widgets[user.id].chips
    assert [c.text() for c in chips] == ["notes.md", "tool.py"]
    sent = "".join(chr(i) for i in fake.calls[-1]["prompt_ids"])
    assert "Attached file: notes.md" in sent and "The answer is 42." in sent
    assert "Attached file: tool.py" in sent and sent.index("tool.py") < sent.index("What is")
    conv = win.current_conv
    win.close()
    w2 = make_window(qtbot, tmp_path, fake)
    w2.chats.open_conversation(conv)
    assert [c.text() for c in w2.view.widgets[user.id].chips] == ["notes.md", "tool.py"]
    w2.close()


def test_pdf_text_is_extracted(tmp_path):
    from pypdf import PdfWriter

    from app.chat.attachments import AttachmentError, read_attachment

    blank = tmp_path / "blank.pdf"
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    with open(blank, "wb") as f:
        writer.write(f)
    with pytest.raises(AttachmentError, match="no text"):
        read_attachment(blank)
    binary = tmp_path / "x.txt"
    binary.write_bytes(b"\0\1\2")
    with pytest.raises(AttachmentError, match="not a text file"):
        read_attachment(binary)


def test_unreadable_attachment_is_reported(qtbot, win, tmp_path):
    win.composer.attach_paths([str(tmp_path / "missing.txt")])
    line = win.composer.attach_error
    assert line.isVisibleTo(win.composer) and "missing.txt" in line.text()
    assert win.composer.attachments == []


def _small_context(w, ctx: int):
    """(The fake loader sets the model's info at load: shrink the context the window sees.)"""
    w.model.info = replace(w.model.info, context_length=ctx)


def test_attachment_that_would_overflow_warns_before_sending(qtbot, tmp_path):
    fake = FakeModel(tokens_per_second=20000, script="ok")
    w = make_window(qtbot, tmp_path, fake)
    _small_context(w, 800)
    big = tmp_path / "big.txt"
    big.write_text("word " * 800, encoding="utf-8")
    w.composer.attach_paths([str(big)])
    assert w.composer.warning.isVisibleTo(w.composer) and "overflow" in w.composer.warning.text()
    w.composer.remove_attachment(0)
    assert not w.composer.warning.isVisibleTo(w.composer)
    w.close()


def test_long_conversation_offers_to_drop_the_oldest_turns(qtbot, tmp_path, monkeypatch):
    from app.chat import attachments

    monkeypatch.setattr(attachments, "CHARS_PER_TOKEN", 1.0)  # the fake: a token per character
    fake = FakeModel(tokens_per_second=20000, script="A reply of some length. " * 4)
    w = make_window(qtbot, tmp_path, fake)
    _small_context(w, 1200)
    w.chat_settings.on_chat_settings_changed(replace(w.conversations.settings_for(w.current_conv),
                                       system_prompt="Be brief.", max_tokens=100))
    asked = []
    w.dialogs.confirm = lambda title, text: asked.append((title, text)) or False
    n = 0
    while not asked and n < 40:
        w.composer.edit.setPlainText(f"question {n} " + "x" * 150)
        w.composer.button.click()
        qtbot.waitUntil(lambda: not w.session.streams, timeout=5000)
        n += 1
    assert asked and "no longer fits" in asked[0][0] and "oldest" in asked[0][1]
    before = len(w.store.messages(w.current_conv))
    assert w.composer.text  # declined: nothing sent, the text is kept
    w.dialogs.confirm = lambda title, text: True
    w.composer.button.click()
    qtbot.waitUntil(lambda: not w.session.streams, timeout=5000)
    assert len(w.store.messages(w.current_conv)) == before + 2  # nothing deleted
    sent = "".join(chr(i) for i in fake.calls[-1]["prompt_ids"])
    assert sent.startswith("<|system|>Be brief.")  # the system prompt is kept
    assert "question 0 " not in sent and f"question {n - 1} " in sent
    assert len(fake.calls[-1]["prompt_ids"]) < 1200
    w.close()
