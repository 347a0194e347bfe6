"""``python -m engine generate --image FILE [--image FILE] --prompt TEXT --chat``, as a user runs
it: the images go before the text of the user turn, the reply equals ``Model.generate`` on the
same rendered prompt; bad files, a missing --chat and a text-only model each end in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine.vision.image_io import decode_image
from tests.engine.vision.conftest import chat
from tests.tinyvision import sample_image

ROOT = Path(__file__).resolve().parents[3]


def generate(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "engine", "generate", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def png(path: Path, h: int, w: int, seed: int) -> Path:
    from PIL import Image

    Image.fromarray(sample_image(h, w, seed)).save(path)
    return path


def test_images_go_before_the_text(vision_dir, vision_model, tmp_path):
    a, b = png(tmp_path / "a.png", 50, 70, 0), png(tmp_path / "b.png", 90, 40, 1)
    out = generate("--model", str(vision_dir), "--image", str(a), "--image", str(b),
                   "--prompt", "Compare them.", "--chat", "--json", "--depth", "2",
                   "--max-tokens", "10")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    images = [decode_image(p.read_bytes()) for p in (a, b)]
    prompt = vision_model.chat_prompt(chat(images, "Compare them."))
    tok = vision_model.tokenizer
    first, last = prompt.images[0], prompt.images[1]
    assert "Compare them." not in tok.decode(list(prompt)[:first.start])
    assert "Compare them." in tok.decode(list(prompt)[last.start + last.tokens:])
    assert got["stats"]["prompt_tokens"] == len(prompt)
    want = [t for e in vision_model.generate(prompt, max_tokens=10, depth=0)
            for t in e.token_ids]
    assert got["token_ids"] == want


def test_bad_uses_end_in_one_line(vision_dir, tmp_path):
    a = png(tmp_path / "a.png", 50, 70, 0)
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    cases = [
        (("--model", str(vision_dir), "--image", str(a), "--prompt", "Hi"), "--chat"),
        (("--model", str(vision_dir), "--image", str(tmp_path / "none.png"), "--prompt", "Hi",
          "--chat"), "none.png"),
        (("--model", str(vision_dir), "--image", str(tmp_path / "bad.png"), "--prompt", "Hi",
          "--chat"), "bad.png"),
        (("--image", str(a), "--prompt", "Hi", "--chat"), "no vision encoder"),  # the demo
    ]
    for args, said in cases:
        out = generate(*args, "--max-tokens", "4")
        assert out.returncode != 0
        lines = [x for x in out.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and said in lines[0], out.stderr
        assert "Traceback" not in out.stderr
