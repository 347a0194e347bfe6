from __future__ import annotations

import pytest

from tests.tinymodels import build_tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=3)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    import engine

    return engine.load(tiny_dir)
