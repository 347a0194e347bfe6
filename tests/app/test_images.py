"""Images in the chat (issue 32): paste, drop and attach; thumbnails; the user turn as parts
(images first) at the engine boundary; saved with the chat and restored; exported; refused in
one line at attach time by a model without vision and for every kind of bad file."""
from __future__ import annotations

import base64
import io
import json
import sqlite3

import numpy as np
import pytest
from PIL import Image
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QGuiApplication, QImage

from app.fake.engine import FakeModel, fake_model_info
from engine.vision.image_io import DecodedImage, decode_image
from tests.app.chat_fixtures import make_window, send

pytestmark = pytest.mark.gui


def png(color=(200, 30, 30), size=(320, 240)) -> bytes:
    px = np.zeros((size[1], size[0], 3), np.uint8)
    px[:] = color
    px[: size[1] // 2, : size[0] // 2] = (20, 20, 220)  # a blue corner: orientation is visible
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "PNG")
    return buf.getvalue()


def jpeg(size=(400, 300)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 160, 60)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture
def fake():
    return FakeModel(tokens_per_second=20000, script="A red picture.",
                     info=fake_model_info(vision=True))


@pytest.fixture
def win(qtbot, tmp_path, fake):
    w = make_window(qtbot, tmp_path, fake)
    yield w
    w.close()


def drop(composer, mime: QMimeData) -> None:
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    composer.dropEvent(event)


def user_parts(fake: FakeModel) -> list[dict]:
    """The last user turn the engine boundary received (``chat_prompt``'s messages)."""
    return [m for m in fake.prompts[-1] if m["role"] == "user"][-1]["content"]


def test_paste_drop_and_attach_show_thumbnails_and_send_parts(qtbot, win, fake, tmp_path):
    c = win.composer
    # 1. paste: a clipboard image (what a screenshot tool leaves there)
    QGuiApplication.clipboard().setImage(QImage.fromData(png()))
    c.edit.setFocus()
    c.edit.paste()
    assert [a.name for a in c.attachments] == ["Pasted image.png"]
    assert decode_image(c.attachments[0].data).digest == decode_image(png()).digest  # same pixels
    # 2. drop: an image file from the file manager
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(jpeg())
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(photo))])
    drop(c, mime)
    # 3. the Attach button's path
    shot = tmp_path / "shot.png"
    shot.write_bytes(png((30, 200, 30)))
    c.attach_paths([str(shot)])
    assert [a.name for a in c.attachments] == ["Pasted image.png", "photo.jpg", "shot.png"]
    assert all(a.kind == "image" for a in c.attachments)
    thumbs = c._chips
    assert len(thumbs) == 3 and not thumbs[0].icon().isNull()
    assert max(thumbs[1].iconSize().width(), thumbs[1].iconSize().height()) == 56
    thumbs[2].click()  # removable
    assert [a.name for a in c.attachments] == ["Pasted image.png", "photo.jpg"]
    assert not c.attach_error.isVisibleTo(c)

    send(qtbot, win, "What is in these pictures?")
    parts = user_parts(fake)
    assert [p["type"] for p in parts] == ["image", "image", "text"]  # images first
    assert parts[2]["text"] == "What is in these pictures?"
    assert isinstance(parts[1]["image"], DecodedImage)
    assert parts[1]["image"].digest == decode_image(jpeg()).digest
    assert parts[0]["image"].pixels.shape == (240, 320, 3)
    sent = "".join(chr(i) for i in fake.calls[-1]["prompt_ids"])
    assert sent.count("<|image:") == 2 and sent.index("<|image:") < sent.index("What is in")
    user = win.store.messages(win.current_conv)[0]
    widget = win.view.widgets[user.id]
    assert len(widget.thumbs) == 2 and widget.thumbs[0].iconSize().width() == 160
    viewer = widget.open_image(widget.thumbs[0].attachment)
    assert (viewer.image.width(), viewer.image.height()) == (320, 240)  # full size
    viewer.close()
    widget.thumbs[1].click()
    assert widget.image_viewer.isVisible()
    widget.image_viewer.close()


def test_a_paste_of_text_with_a_picture_of_it_pastes_the_text(qtbot, win):
    mime = QMimeData()
    mime.setText("A1\tB1")  # what a spreadsheet puts on the clipboard, with a bitmap
    mime.setImageData(QImage.fromData(png()))
    win.composer.edit.insertFromMimeData(mime)
    assert win.composer.text == "A1\tB1" and win.composer.attachments == []


def test_at_most_eight_images_per_message(qtbot, win, tmp_path):
    paths = []
    for i in range(9):
        paths.append(tmp_path / f"i{i}.png")
        paths[-1].write_bytes(png((i * 20, 0, 0), size=(16, 16)))
    win.composer.attach_paths([str(p) for p in paths])
    assert [a.name for a in win.composer.attachments] == [f"i{i}.png" for i in range(8)]
    assert win.composer.attach_error.text() == ("A message can carry at most 8 images; "
                                                "send these first.")
    win.composer.attach_image("more.png", png())
    assert len(win.composer.attachments) == 8


def test_drop_of_image_data_without_a_file(qtbot, win):
    mime = QMimeData()
    mime.setImageData(QImage.fromData(png()))
    drop(win.composer, mime)
    assert [a.kind for a in win.composer.attachments] == ["image"]
    assert decode_image(win.composer.attachments[0].data).pixels.shape == (240, 320, 3)


def test_images_are_saved_restored_and_sent_again_after_reopening(qtbot, tmp_path, fake):
    w = make_window(qtbot, tmp_path, fake)
    data = png()
    (tmp_path / "red.png").write_bytes(data)
    w.composer.attach_paths([str(tmp_path / "red.png")])
    send(qtbot, w, "Describe it.")
    conv = w.current_conv
    w.close()
    # the SQLite file itself holds the bytes
    con = sqlite3.connect(tmp_path / "chats.db")
    (name, kind, blob), = con.execute("SELECT name, kind, data FROM attachments").fetchall()
    con.close()
    assert (name, kind, blob) == ("red.png", "image", data)
    w2 = make_window(qtbot, tmp_path, fake)
    try:
        w2.chats.open_conversation(conv)
        user = w2.store.messages(conv)[0]
        assert [t.attachment.name for t in w2.view.widgets[user.id].thumbs] == ["red.png"]
        send(qtbot, w2, "And the colour?")
        turns = [m for m in fake.prompts[-1] if m["role"] == "user"]
        first, second = turns[0]["content"], turns[1]["content"]
        assert first[0]["image"].digest == decode_image(data).digest
        assert second == "And the colour?"  # a turn without images stays a string
    finally:
        w2.close()


def test_an_image_damaged_on_disk_shows_its_name_and_the_chat_goes_on(qtbot, tmp_path, fake):
    w = make_window(qtbot, tmp_path, fake)
    w.composer.attach_image("red.png", png())
    send(qtbot, w, "Describe it.")
    conv = w.current_conv
    w.close()
    con = sqlite3.connect(tmp_path / "chats.db")
    con.execute("UPDATE attachments SET data = substr(data, 1, 100)")  # a damaged blob
    con.commit()
    con.close()
    w2 = make_window(qtbot, tmp_path, fake)
    try:
        w2.chats.open_conversation(conv)
        user = w2.store.messages(conv)[0]
        widget = w2.view.widgets[user.id]
        assert widget.thumbs == [] and [c.text() for c in widget.chips] == ["red.png"]
        send(qtbot, w2, "Still there?")
        first = [m for m in fake.prompts[-1] if m["role"] == "user"][0]["content"]
        assert first.startswith("[image red.png could not be read: the image is damaged")
        assert w2.store.messages(conv)[-1].meta["status"] == "done"
    finally:
        w2.close()


def test_export_carries_the_images(qtbot, win, tmp_path):
    data = png()
    win.composer.attach_image("cat [1].png", data)
    send(qtbot, win, "Look.")
    conv = win.current_conv
    md = win.conversations.export(conv, "md", tmp_path / "chat.md").read_text("utf-8")
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    assert f"![cat (1).png]({uri})" in md
    assert md.index("## User") < md.index("![cat") < md.index("## Assistant")
    doc = json.loads(win.conversations.export(conv, "json", tmp_path / "chat.json").read_text())
    att = doc["messages"][0]["attachments"][0]
    assert att["kind"] == "image" and att["mime"] == "image/png"
    assert base64.b64decode(att["data_base64"]) == data


def test_a_model_without_vision_refuses_at_attach_time(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=20000))
    try:
        c = w.composer
        c.edit.setPlainText("keep this text")
        (tmp_path / "notes.txt").write_text("notes", encoding="utf-8")
        c.attach_paths([str(tmp_path / "notes.txt")])
        (tmp_path / "a.png").write_bytes(png())
        (tmp_path / "b.png").write_bytes(png())
        c.attach_paths([str(tmp_path / "a.png"), str(tmp_path / "b.png")])
        QGuiApplication.clipboard().setImage(QImage.fromData(png()))
        c.edit.paste()
        assert [a.name for a in c.attachments] == ["notes.txt"]  # nothing lost, no image
        assert c.text == "keep this text"
        line = c.attach_error.text()
        assert c.attach_error.isVisibleTo(c) and "\n" not in line
        assert line == ("fake-mtp-model cannot read images (it has no vision encoder); "
                        "load a vision model to send images.")
    finally:
        w.close()


def test_the_demo_model_refuses_an_image_in_one_line(qtbot, tmp_path):
    from app.chat.main_window import MainWindow
    from engine.resources import default_model_path

    w = MainWindow(model_path=str(default_model_path()), db_file=tmp_path / "db.sqlite")
    qtbot.addWidget(w)
    w.show()
    try:
        qtbot.waitUntil(lambda: w.model.info is not None or w.banner.isVisibleTo(w),
                        timeout=120_000)
        assert w.model.info is not None, w.banner.text()
        (tmp_path / "s.png").write_bytes(png())
        w.composer.attach_paths([str(tmp_path / "s.png")])
        assert w.composer.attachments == []
        line = w.composer.attach_error.text()
        assert "cannot read images" in line and w.model.info.name in line and "\n" not in line
    finally:
        w.close()


def _bad_files(tmp_path):
    good = png()
    bomb = io.BytesIO()
    Image.new("1", (20000, 20000)).save(bomb, "PNG")
    return {
        "truncated.png": (good[: len(good) // 2], "damaged or truncated"),
        "corrupt.jpg": (b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4, ""),
        "bomb.png": (bomb.getvalue(), "megapixels"),
        "drawing.svg": (b'<svg xmlns="http://www.w3.org/2000/svg"/>',
                        "SVG is not supported; export it as PNG"),
        "notes.png": (b"this is text, not a picture\n", "not an image"),
        "phone.heic": (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\0" * 32, ""),
        "empty.png": (b"", "empty"),
    }


def test_bad_images_through_the_attach_path_are_one_line_and_lose_nothing(qtbot, win, tmp_path):
    c = win.composer
    c.edit.setPlainText("draft")
    c.attach_image("good.png", png())
    for name, (data, expected) in _bad_files(tmp_path).items():
        path = tmp_path / name
        path.write_bytes(data)
        c.attach_paths([str(path)])
        line = c.attach_error.text()
        assert c.attach_error.isVisibleTo(c), name
        assert line.startswith(name) and "\n" not in line and len(line) <= 160, line
        assert expected in line, (name, line)
        assert [a.name for a in c.attachments] == ["good.png"], name
        assert c.text == "draft"
    c.attach_paths([str(tmp_path / "missing.png")])
    assert "missing.png cannot be read" in c.attach_error.text()
    c.attach_image("ok.png", png())  # a good one clears the line
    assert not c.attach_error.isVisibleTo(c)
    assert len(c.attachments) == 2


def test_a_chat_with_images_goes_on_with_a_text_model(qtbot, tmp_path, fake):
    """Images sent to a vision model are named in a note for a model that cannot read them,
    and a pending image is refused at send time if the model changed after it was attached."""
    from app.chat.images import user_content
    from app.db import Attachment

    img = Attachment("a.png", "", "image", png())
    note = user_content("hi", [img, Attachment("f.txt", "text", "text")], vision=False)
    assert note.startswith("[1 image(s) not shown to this model: a.png]")
    assert "Attached file: f.txt" in note and note.endswith("hi")
    parts = user_content("hi", [img], vision=True)
    assert [p["type"] for p in parts] == ["image", "text"]

    w = make_window(qtbot, tmp_path, fake)
    try:
        w.composer.attach_image("a.png", png())
        w.model.info = fake_model_info()  # a text model now
        w.sending.sync_composer()
        w.composer.edit.setPlainText("hello")
        w.composer.button.click()
        assert not w.session.streams and w.store.messages(w.current_conv) == []
        assert "cannot read images" in w.composer.attach_error.text()
        assert len(w.composer.attachments) == 1  # kept: remove it, or load a vision model
    finally:
        w.close()


def test_schema_v3_file_is_upgraded_and_keeps_its_attachments(tmp_path):
    from app.db import MIGRATIONS, ChatStore

    path = tmp_path / "old.db"
    con = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:3]:
        step(con)
    con.execute("PRAGMA user_version = 3")
    con.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('t', 0, 0)")
    con.execute("INSERT INTO messages (conversation_id, role, content, created_at) "
                "VALUES (1, 'user', 'hi', 0)")
    con.execute("INSERT INTO attachments (message_id, name, kind, content, created_at) "
                "VALUES (1, 'n.txt', 'text', 'body', 0)")
    con.close()
    store = ChatStore(path)
    assert store.schema_version == 4
    (a,), = store.attachments([1]).values()
    assert (a.name, a.kind, a.content, a.data) == ("n.txt", "text", "body", b"")
    store.close()


def test_the_worker_renders_image_parts_only_for_a_vision_model(qtbot):
    """The engine boundary: image parts go to ``chat_prompt``; a model without vision, or a
    chat with tools, fails the request in one line (the worker survives)."""
    from app.worker import GenerationRequest
    from engine.vision.image_io import from_pixels
    from tests.app.chat_fixtures import Relay, start_worker

    image = from_pixels(np.zeros((4, 6, 3), np.uint8))
    msgs = ({"role": "user", "content": [{"type": "image", "image": image},
                                          {"type": "text", "text": "hi"}]},)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for fake, tools, expected in [
            (FakeModel(tokens_per_second=20000, info=fake_model_info(vision=True)), (), None),
            (FakeModel(tokens_per_second=20000), (), "cannot read images"),
            (FakeModel(tokens_per_second=20000, info=fake_model_info(vision=True)), (tool,),
             "Images and tools")]:
        wt, _ = start_worker(fake)
        relay = Relay(wt.worker)
        try:
            with qtbot.waitSignal(relay.loaded, timeout=5000):
                wt.worker.load_model("m")
            done = relay.finished if expected is None else relay.failed
            with qtbot.waitSignal(done, timeout=5000) as blocker:
                wt.worker.submit(GenerationRequest(request_id=1, messages=msgs, tools=tools))
            if expected is None:
                sent = "".join(chr(i) for i in fake.calls[-1]["prompt_ids"])
                assert sent.startswith(f"<|user|><|image:6x4:{image.digest[:12]}|>hi\n")
            else:
                assert expected in blocker.args[1] and "\n" not in blocker.args[1]
        finally:
            assert wt.shutdown(timeout_ms=10_000)
