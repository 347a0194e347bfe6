"""Fixtures shared by the app tests."""
from __future__ import annotations

import pytest

from app.fake.engine import FakeModel
from tests.app.chat_fixtures import make_window


@pytest.fixture
def win(qtbot, tmp_path):
    """The main window over a fast scripted fake engine and a temporary database (a test
    module may define its own ``win``, e.g. over its own ``fake``)."""
    w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=20000))
    yield w
    w.close()
