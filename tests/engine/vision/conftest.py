from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vision_dir(tmp_path_factory):
    from tests.tinyvision import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("tinyvision") / "m")


@pytest.fixture(scope="session")
def vision_model(vision_dir):
    import engine

    return engine.load(vision_dir)


@pytest.fixture(scope="session")
def images():
    """Two images of one size (the same ids, other pixels) and one of another size."""
    import numpy as np

    from engine.vision.image_io import from_pixels
    from tests.tinyvision import sample_image

    a = sample_image(50, 70, seed=0)
    return [from_pixels(a), from_pixels(np.ascontiguousarray(255 - a[::-1])),
            from_pixels(sample_image(90, 40, seed=1))]


def chat(images: list, text: str = "What is in this image?") -> list[dict]:
    parts = [{"type": "image", "image": im} for im in images]
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]
