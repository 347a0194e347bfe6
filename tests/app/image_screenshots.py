"""Screenshots of a conversation with images (issue 32) for docs/screenshots/images:

    xvfb-run -a -s "-screen 0 1920x1080x24" env QT_QPA_PLATFORM=xcb PYTHONPATH=$PWD \
        python -m tests.app.image_screenshots docs/screenshots/images

The real ``MainWindow`` over the scripted fake engine with a vision-capable model info: one
sent message with a screenshot (its thumbnail in the bubble), a reply, then two images waiting
in the composer (their removable thumbnails), at 900x650 and 1920x1080 in both themes, and the
full-size viewer a thumbnail opens; and a model without vision refusing a pasted image.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-image-shots-"))

from tests.app.screenshots import _grab, _pump, _send  # noqa: E402

SIZES = {"900x650": (900, 650), "1920x1080": (1920, 1080)}
REPLY = """The screenshot shows a Python traceback from `parse_config`:

- **Error:** `KeyError: 'port'` on line 42 of `server.py`.
- **Cause:** the config file has no `port` key, and the code reads it with `cfg["port"]`.

Use a default instead:

```python
port = cfg.get("port", 8080)
```
"""


def editor_screenshot() -> bytes:
    """A made-up editor window with a traceback (drawn with Pillow: no binary fixture)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (960, 600), (30, 32, 40))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, 960, 34), fill=(50, 54, 66))
    for i, c in enumerate([(237, 106, 94), (245, 191, 79), (98, 197, 84)]):
        d.ellipse((14 + 22 * i, 10, 28 + 22 * i, 24), fill=c)
    d.text((400, 10), "server.py - editor", fill=(200, 200, 210))
    lines = ["Traceback (most recent call last):", '  File "server.py", line 42, in <module>',
             "    port = cfg[\"port\"]", "KeyError: 'port'"]
    for i, line in enumerate(lines):
        d.text((24, 60 + 26 * i), line, fill=(240, 110, 110) if i == 3 else (210, 214, 224))
    for i in range(12):
        d.rectangle((24, 200 + 28 * i, 24 + 60 + (i * 97) % 600, 212 + 28 * i),
                    fill=(70 + i * 9 % 80, 110, 160))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def photo() -> bytes:
    """A smooth colour field (sky, sun, ground) as a JPEG."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:480, 0:640]
    px = np.zeros((480, 640, 3), np.uint8)
    px[..., 0] = 90 + y * 120 // 480
    px[..., 1] = 150 + y * 60 // 480
    px[..., 2] = 230 - y * 100 // 480
    sun = (x - 460) ** 2 + (y - 140) ** 2 < 60 ** 2
    px[sun] = (255, 214, 90)
    px[y > 340] = (70, 130, 60)
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def main(argv: list[str]) -> int:
    from PySide6.QtGui import QGuiApplication, QImage
    from PySide6.QtWidgets import QApplication

    from app.chat.main_window import MainWindow
    from app.chat.settings_dialog import AppPreferences
    from app.fake.engine import FakeModel, fake_model_info, make_fake_loader

    out = Path(argv[0] if argv else "docs/screenshots/images")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    home = Path(os.environ["MTPCHAT_HOME"])
    fake = FakeModel(tokens_per_second=3000, script=REPLY, info=fake_model_info(vision=True))
    (home / "fake-model").mkdir(parents=True, exist_ok=True)
    w = MainWindow(model_path=str(home / "fake-model"), loader=make_fake_loader(fake),
                   db_file=home / "shots.db")
    w.show()
    _pump(app, 1.0)
    w.composer.attach_image("traceback.png", editor_screenshot())
    _send(app, w, "What does this error mean?")
    QGuiApplication.clipboard().setImage(QImage.fromData(photo()))  # the real clipboard
    w.composer.edit.paste()
    w.composer.attach_image("traceback.png", editor_screenshot())
    w.composer.edit.setPlainText("And these two?")
    names = [a.name for a in w.composer.attachments]
    sent = w.view.widgets[min(w.view.widgets)]
    if names != ["Pasted image.png", "traceback.png"] or len(sent.thumbs) != 1:
        print(f"unexpected attachments {names}", file=sys.stderr)
        return 1
    for theme in ("light", "dark"):
        w.apply_preferences(AppPreferences(theme=theme))
        for name, size in SIZES.items():
            _grab(app, w, out / f"chat-images-{theme}-{name}.png", size)
    # a model without a vision encoder: the image is refused in one line under the box
    w.apply_preferences(AppPreferences(theme="light"))
    w.composer.set_attachments([])
    w.composer.set_vision(False, "mtp-demo-qwen3_5")
    w.composer.attach_image("Pasted image.png", photo())
    _grab(app, w, out / "refused-light-900x650.png", SIZES["900x650"])
    w.apply_preferences(AppPreferences(theme="dark"))
    user = min(w.view.widgets)
    viewer = w.view.widgets[user].open_image(w.view.widgets[user].thumbs[0].attachment)
    _grab(app, viewer, out / "viewer-dark.png", None)
    viewer.close()
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
