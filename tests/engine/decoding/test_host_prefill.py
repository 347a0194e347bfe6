"""A long prompt's attention on the host (``cpu_attention.host_attention``, taken by
``trunk.prefill_attention_layer`` for prefill chunks over 2k+ keys on the CPU branch): the same
logits as MLX's attention to float32 rounding, and decoding after it as exact as ever."""
from __future__ import annotations

import numpy as np
import pytest

import engine
import mlx.core as mx

from engine.bench.long_context import fill_prompt
from engine.decoding.session import Session
from engine.models import cpu_attention, device


@pytest.fixture(scope="module")
def demo():
    return engine.load(engine.default_model_path())


@pytest.fixture(scope="module")
def prompt(demo):
    texts = ["def helper(x):\n    return x * 2 + 1", "The quick brown fox jumps over the dog.",
             "Explain what os.path.join does, with an example."]
    return fill_prompt(demo, 2600, texts)


def _prefill_logits(model, ids):
    s = Session.fresh(model, use_mtp=True)
    s.prefill(ids)
    mx.eval(s.last_logits)
    return np.array(s.last_logits)


def test_long_prefill_takes_the_host_and_keeps_the_logits(demo, prompt, monkeypatch):
    if not device.is_cpu():
        pytest.skip("the CPU branch's path")
    calls = []
    real = cpu_attention.host_attention

    def counting(*a, **kw):
        calls.append(a[0].shape)
        return real(*a, **kw)
    monkeypatch.setattr(cpu_attention, "host_attention", counting)
    host = _prefill_logits(demo, prompt)
    # chunks of 512: the two that reach 2,048 and 2,560 keys, in both attention layers (the
    # last chunk's 40 queries have too few scores)
    assert [c[2] for c in calls] == [512, 512, 512, 512]
    monkeypatch.setattr(cpu_attention, "HOST_MIN_SCORES", 1 << 60)
    calls.clear()
    ref = _prefill_logits(demo, prompt)
    assert calls == []
    np.testing.assert_allclose(host, ref, atol=2e-4, rtol=1e-4)
    assert int(host.argmax()) == int(ref.argmax())


def test_greedy_mtp_equals_plain_after_a_long_prompt(demo, prompt):
    def ids(depth):
        return [t for ev in demo.generate(prompt, max_tokens=24, depth=depth)
                for t in ev.token_ids]
    plain = ids(0)
    assert len(plain) >= 2
    assert ids(3) == plain
