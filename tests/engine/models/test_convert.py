"""engine convert: raw HF -> MLX layout (optionally 4/8-bit) keeping the MTP head."""
from __future__ import annotations

import threading

import mlx.core as mx
import numpy as np
import pytest

import engine
from engine.core.carryover import carryover_of
from engine.errors import EngineError
from engine.models.convert import ConversionCancelled, convert


def _greedy(model, prompt, depth, n=24):
    carryover_of(model).reset_prompt_cache()
    return [t for ev in model.generate(prompt, max_tokens=n, depth=depth) for t in ev.token_ids]


def test_unquantized_convert_keeps_logits(tiny_dir, tiny_model, tmp_path):
    out = convert(tiny_dir, tmp_path / "mlx")
    m = engine.load(out)
    assert m.info.layout == "mlx" and m.info.has_mtp and m.info.quantization is None
    ids = mx.array([[5, 6, 7, 8, 9]])
    np.testing.assert_allclose(np.array(m.trunk(ids)), np.array(tiny_model.trunk(ids)), atol=1e-5)
    assert _greedy(m, [5, 6, 7, 8], 3) == _greedy(tiny_model, [5, 6, 7, 8], 0)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_model_with_mtp_loads_and_speculates(tiny_dir, tmp_path, bits):
    progress = []
    out = convert(tiny_dir, tmp_path / f"q{bits}", bits=bits, group_size=32,
                  progress=lambda f, msg: progress.append(f))
    assert progress[0] == 0.0 and progress[-1] == 1.0
    m = engine.load(out)
    assert m.info.quantization["bits"] == bits and m.info.has_mtp
    assert m.mtp.fc.bits == 8  # never below 8 bits
    assert m.mtp.layers[0].self_attn.q_proj.bits == max(bits, 8)  # head kept at >= 8 bits
    for p in ([5, 6, 7, 8], [30, 31, 2, 200, 17]):
        base = _greedy(m, p, 0)
        for d in (1, 2, 3):
            assert _greedy(m, p, d) == base
    # the converted MTP head still drafts what the original head drafts, mostly
    events = list(m.generate([5, 6, 7, 8], max_tokens=24, depth=2))
    assert all(e.stats.depth <= 2 for e in events if e.stats)


def test_cancel_and_existing_destination(tiny_dir, tmp_path):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ConversionCancelled):
        convert(tiny_dir, tmp_path / "c", bits=4, group_size=32, cancel=cancel)
    assert not (tmp_path / "c").exists() and not (tmp_path / "c.converting").exists()
    (tmp_path / "exists").mkdir()
    with pytest.raises(EngineError, match="already exists"):
        convert(tiny_dir, tmp_path / "exists")
