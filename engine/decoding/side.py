"""A second CPU stream for the work a reply needs later, not now: the MTP head's cache.

MLX's CPU backend runs each stream's work on a thread of its own, in order; the decode runs on
one stream, its products on one OpenBLAS thread, so on the CPU branch a second core sits idle
while a reply decodes. Two pieces of work of every turn lie off that stream's critical path:

- the MTP head's keys and values for the prompt's pairs (``Session.flush_pending``): only a
  draft step reads them, and a reply at depth 0 drafts only when the depth controller probes;
- a joining row's MTP cache copied into the batch's (``Batch.join``).

Both were left lazy, so the reply's first draft paid them: 50-75 ms at 12k tokens on the demo
against 15-20 ms for a decode step (docs/benchmarks.md). Built on this stream and started at
once (``start``), they compute on the other core while the trunk prefills and decodes; the
first draft waits only for what is not done yet (MLX orders work across streams by events).
The values are the same bits: the same operations on the same inputs.

``MTPCHAT_SIDE_STREAM`` (0 or 1) switches it; by default it is on on the CPU branch (a Metal
GPU runs one stream's work at a time anyway). ``stream()`` is per thread: MLX (0.31.2+) runs a
stream's work only for the thread that made it, and the decode runs on one (the scheduler's,
the app's worker).
"""
from __future__ import annotations

import contextlib
import threading

import mlx.core as mx

SIDE_ENV = "MTPCHAT_SIDE_STREAM"
_local = threading.local()


def enabled() -> bool:
    """``$MTPCHAT_SIDE_STREAM`` (0 or 1), else on the CPU branch; decided once per value of
    both (it is asked at every prefill chunk: a malformed value warns once)."""
    from engine.models import cpu_products, device

    return cpu_products.switch_once(SIDE_ENV, device.is_cpu(), "deciding by the device")


def stream() -> mx.Stream | None:
    """This thread's side stream (made on first use), or None where it is off."""
    if not enabled():
        return None
    s = getattr(_local, "stream", None)
    if s is None:
        s = _local.stream = mx.new_stream(mx.cpu)
    return s


@contextlib.contextmanager
def side():
    """Build the operations inside on the side stream (on the default one where it is off)."""
    s = stream()
    if s is None:
        yield
        return
    with mx.stream(s):
        yield


def release() -> None:
    """Wait for this thread's side stream, if it made one, and forget it: what
    ``engine.core.threadexit.release_thread_streams`` runs before MLX drops the thread's
    streams (``mx.clear_streams``)."""
    s = getattr(_local, "stream", None)
    if s is not None:
        _local.stream = None
        mx.synchronize(s)


def start(arrays: list) -> None:
    """Set ``arrays`` computing now (where the side stream is on; else they stay lazy, as
    before: the first draft evaluates them)."""
    arrays = [a for a in arrays if a is not None]
    if arrays and stream() is not None:
        mx.async_eval(arrays)
