"""Loading the MTP-carrying layouts others publish (tests/thirdparty.py writes them exactly):
the head is found, its norms are shifted exactly once, and greedy MTP equals depth 0."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.hub.inspection import inspect_local
from tests.thirdparty import write_mlxlm_mtp, write_mtplx_pack

LAYOUTS = {
    "mlx-lm PR, float": lambda src, out: write_mlxlm_mtp(src, out),
    "mlx-lm PR, 4-bit (head too)": lambda src, out: write_mlxlm_mtp(src, out, bits=4),
    "MTPLX pack, bf16 head": lambda src, out: write_mtplx_pack(src, out),
    "MTPLX pack, prequantized head": lambda src, out: write_mtplx_pack(src, out,
                                                                       prequantized=True),
}


def _greedy(m, depth: int, n: int = 20) -> list[int]:
    from engine.types import SamplingParams

    prompt = m.tokenizer.encode("json.dumps serializes an object")
    events = m.generate(prompt, max_tokens=n, depth=depth, sampling=SamplingParams(temperature=0))
    return [t for e in events for t in getattr(e, "token_ids", ())]


def _close(a, b, atol) -> bool:
    return np.allclose(np.array(a), np.array(b), atol=atol)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_loads_with_its_head_and_speculates_exactly(layout, tiny_dir, tiny_model,
                                                           tmp_path):
    out = LAYOUTS[layout](tiny_dir, tmp_path / "m")
    report = inspect_local(out)
    assert report["supported"] and report["has_mtp"] and report["can_speculate"], report
    m = engine.load(out)
    assert m.mtp is not None and m.info.has_mtp
    ref = tiny_model.mtp
    # Norms shifted exactly once (a double or missing shift is off by 1.0).
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert _close(getattr(m.mtp, name).weight, getattr(ref, name).weight, 1e-2), name
    assert _close(m.mtp.layers[0].input_layernorm.weight, ref.layers[0].input_layernorm.weight,
                  1e-2)
    if "prequantized" in layout:
        assert m.mtp.layers[0].self_attn.q_proj.bits == 4 and not hasattr(m.mtp.fc, "bits")
    base = _greedy(m, 0)
    assert len(base) == 20
    for depth in (1, 3):
        assert _greedy(m, depth) == base, (layout, depth)


def test_declared_sidecar_that_is_missing_is_one_clear_error(tiny_dir, tmp_path):
    from engine.errors import ModelLoadError

    out = write_mtplx_pack(tiny_dir, tmp_path / "m")
    (out / "mtp.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="names the MTP file 'mtp.safetensors'"):
        engine.load(out)
