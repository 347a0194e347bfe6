"""The MTP head's cache built on a second CPU stream (``engine.decoding.side``): the same bits
as on the decode's stream, decoding stays exact, each thread gets its own stream."""
from __future__ import annotations

import threading

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest

from engine.core.carryover import carryover_of
from engine.decoding import side
from engine.decoding.batch_caches import Batch
from engine.decoding.session import Session
from tests.engine.decoding.test_batching import alone, assert_exact_and_row_independent
from tests.engine.decoding.test_decode import prompts

pytestmark = pytest.mark.timeout(300)


def _mtp_state(model, ids, on: bool, monkeypatch) -> tuple[list, list]:
    """The MTP cache of a session prefilled with ``ids`` and of a batch it joined, as
    numpy arrays, with the side stream ``on`` or off."""
    monkeypatch.setenv(side.SIDE_ENV, "1" if on else "0")
    s = Session.fresh(model, use_mtp=True)
    s.prefill(ids)
    own = [np.array(a[..., :c.offset, :]) for c in s.mtp_cache for a in (c.keys, c.values)]
    batch = Batch(model, use_mtp=True)
    batch.join(s)
    n = batch.mtp_cache[0].lengths[0]
    joined = [np.array(a[..., :n, :]) for c in batch.mtp_cache for a in (c.keys, c.values)]
    return own, joined


def test_the_cache_is_the_same_bits_on_either_stream(tiny_model, monkeypatch):
    ids = list(range(3, 1200, 2))  # three prefill chunks
    on, off = (_mtp_state(tiny_model, ids, flag, monkeypatch) for flag in (True, False))
    for a, b in zip(on[0] + on[1], off[0] + off[1]):
        assert a.shape == b.shape and a.shape[2] == len(ids) - 1
        np.testing.assert_array_equal(a, b)


def test_decoding_stays_exact_with_the_side_stream(tiny_model, monkeypatch):
    monkeypatch.setenv(side.SIDE_ENV, "1")
    assert side.stream() is not None
    assert_exact_and_row_independent(tiny_model, prompts(4, seed=11), seed=70)


def test_each_thread_decodes_with_its_own_side_stream(tiny_model, monkeypatch):
    """MLX runs a stream's work only for the thread that made it: a decode on another thread
    (the server's scheduler, the app's worker) makes its own."""
    monkeypatch.setenv(side.SIDE_ENV, "1")
    p = prompts(1, seed=5)[0]
    carryover_of(tiny_model).reset_prompt_cache()
    ref = alone(tiny_model, p, depth=2, max_tokens=12)
    out, streams, errors = [], [], []

    def work():
        try:
            carryover_of(tiny_model).reset_prompt_cache()
            streams.append(side.stream())
            out.append(alone(tiny_model, p, depth=2, max_tokens=12))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join(120)
    carryover_of(tiny_model).reset_prompt_cache()
    assert not errors and out == [ref]
    assert streams[0] != side.stream()


def test_the_switch(monkeypatch):
    monkeypatch.setenv(side.SIDE_ENV, "0")
    assert side.stream() is None
    with side.side():
        x = mx.ones((3,)) + 1
    side.start([x])  # off: nothing to start, the array stays lazy and evaluates as before
    assert x.tolist() == [2.0, 2.0, 2.0]
    monkeypatch.setenv(side.SIDE_ENV, "1")
    assert side.stream() is not None
    monkeypatch.delenv(side.SIDE_ENV)
    from engine.models import device

    assert (side.stream() is not None) == device.is_cpu()
