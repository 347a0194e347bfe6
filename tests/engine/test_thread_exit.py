"""A process whose scheduler thread decoded exits cleanly (engine/core/threadexit.py).

Before the fix, MLX's thread-local compile cache was destroyed after the scheduler thread's
Python code ended, and took the GIL back while the main thread finalized the interpreter: the
process aborted at exit ("terminate called without an active exception", status 134) in most
runs of this script (a plain thread running the same batch: 9 of 10)."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)

SCRIPT = r"""
import sys, threading
import engine
from engine.core.scheduler import Done, GenRequest, Scheduler
from engine.types import SamplingParams

model = engine.load(sys.argv[1])
sched = Scheduler(model=model, max_streams=2).start()
sched.wait_ready(60)
done = [threading.Event(), threading.Event()]
ids = tuple(model.tokenizer.encode("hello there"))
for i, ev in enumerate(done):
    sched.submit(GenRequest(id=f"r{i}", prompt_ids=ids, max_tokens=12, depth=3,
                            sampling=SamplingParams(temperature=0.0)),
                 lambda item, ev=ev: isinstance(item, Done) and ev.set())
assert all(ev.wait(120) for ev in done)
sched.stop()
print("stopped")
"""


def test_a_process_whose_scheduler_decoded_exits_without_an_abort(tiny_dir):
    codes = []
    for _ in range(4):
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_dir)],
                             capture_output=True, text=True, timeout=240)
        assert "terminate called" not in out.stderr, out.stderr[-2000:]
        assert "stopped" in out.stdout, out.stderr[-2000:]
        codes.append(out.returncode)
    assert codes == [0] * len(codes)
