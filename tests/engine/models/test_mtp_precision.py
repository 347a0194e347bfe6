"""How MTP-head precision moves acceptance (issue 18 item 3), on the demo model's trained head.

Slow (about a minute on 2 cores): ``python -m pytest -m slow tests/engine/models/test_mtp_precision.py
-s`` prints the table. Figures on this project's machine are in engine/models/convert.py's ``_quantize``.
"""
from __future__ import annotations

import json

import pytest

DEMO_PROMPTS = 16


def _variant(kind: str):
    import mlx.nn as nn

    import engine
    from engine.resources import default_model_path

    def q(mod, bits, pred=None):
        nn.quantize(mod, group_size=64, bits=bits, class_predicate=pred or (
            lambda p, x: hasattr(x, "to_quantized") and x.weight.shape[-1] % 64 == 0))

    m = engine.load(default_model_path())
    q(m.trunk, 4)
    if kind == "8-bit":
        q(m.mtp, 8)
    elif kind == "4-bit, fc 8-bit":
        q(m.mtp, 4, lambda p, x: ({"group_size": 64, "bits": 8} if p == "fc" else True)
          if hasattr(x, "to_quantized") else False)
    elif kind == "4-bit incl. fc":
        q(m.mtp, 4)
    return m


def _acceptance(m) -> float:
    from engine.resources import default_model_path
    from engine.types import SamplingParams

    prompts = json.loads((default_model_path() / "heldout_prompts.json").read_text())
    drafted = accepted = 0
    for p in prompts[:DEMO_PROMPTS]:
        ids = m.chat_ids([{"role": "user", "content": p}])
        for e in m.generate(ids, max_tokens=48, depth=3, sampling=SamplingParams(temperature=0)):
            if e.stats is not None:
                drafted += len(e.stats.drafted)
                accepted += e.stats.accepted
    return accepted / drafted


@pytest.mark.slow
def test_head_precision_table_and_convert_policy():
    from engine.models.convert import MTP_MIN_BITS

    table = {k: _acceptance(_variant(k)) for k in ("unquantized", "8-bit", "4-bit, fc 8-bit",
                                                   "4-bit incl. fc")}
    for k, v in table.items():
        print(f"MTP head {k:18} acceptance {v:.3f}")
    assert MTP_MIN_BITS == 8
    assert table["8-bit"] >= table["unquantized"] - 0.005  # what convert keeps
