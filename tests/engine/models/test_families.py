"""Every MTP family behind the seam (``engine.models.families``), one parametrized suite.

- trunk parity: greedy output of a tiny random checkpoint in the family's raw HF layout
  equals transformers' on the same weights (float32), raw and after ``engine convert``;
- drafts equal an independent reference head assembled from transformers' modules
  (``families_oracle``) at every depth step, and the oracle tells the wiring mistakes apart;
- greedy depths 1-4 equal depth 0; replayed drafts are all accepted; seeded streams equal
  batched and alone; per-row rollback after each commit equals a fresh decode; sampled depth 2
  follows plain decoding (chi-square, one setting);
- broken checkpoints end in one line naming the problem.

Qwen3.5's transformers parity lives in ``test_reference_parity.py``; it runs the decoding
checks here too, through the same seam.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import engine
from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.decoding.decoder import BatchDecoder
from engine.decoding.drafters import ReplayDrafter
from engine.decoding.session import Session
from engine.errors import ModelLoadError
from tests.engine.decoding.test_batching import alone, batched
from tests.engine.decoding.test_decode import draft_one, prompts
from tests.tinyfamilies import FAMILIES, NEXTN, build_tiny_family
from tests.tinymodels import build_tiny_model

ALL = ("qwen3_5",) + FAMILIES
N_SAMPLES = 600


def _build(folder, family, **kw):
    if family == "qwen3_5":
        return build_tiny_model(folder, seed=kw.pop("seed", 3), **kw)
    return build_tiny_family(folder, family, seed=kw.pop("seed", 1), **kw)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {f: _build(tmp_path_factory.mktemp(f) / "m", f) for f in ALL}


@pytest.fixture(scope="module")
def models(folders):
    return {f: engine.load(folders[f]) for f in ALL}


def _tokens(model, prompt, *, depth, n=24, **kw) -> list[int]:
    carryover_of(model).reset_prompt_cache()
    return [t for ev in model.generate(prompt, max_tokens=n, depth=depth, **kw)
            for t in ev.token_ids]


# --------------------------------------------------------------------------- transformers

@pytest.mark.parametrize("family", FAMILIES)
def test_trunk_greedy_equals_transformers_raw_and_converted(family, folders, models,
                                                            tmp_path):
    pytest.importorskip("torch")
    from engine.models.convert import convert
    from tests.engine.models.families_oracle import torch_greedy

    converted = engine.load(convert(folders[family], tmp_path / "mlx"))
    assert models[family].info.layout == "hf" and converted.info.layout == "mlx"
    assert converted.info.has_mtp  # the converted checkpoint keeps its head
    for p in prompts(2, seed=40):
        want = torch_greedy(folders[family], p, 10)
        assert _tokens(models[family], p, depth=0, n=10) == want
        assert _tokens(converted, p, depth=0, n=10) == want
    assert _tokens(converted, p, depth=3, n=10) == want


def _engine_drafts(model, prompt, k):
    """The engine's greedy x0 and k head drafts with the logits of every step."""
    s = Session.fresh(model, use_mtp=True)
    s.prefill(prompt)
    x0 = int(mx.argmax(s.last_logits).item())
    hidden = s.last_hidden if s.pending_h is None else \
        mx.concatenate([s.pending_h, s.last_hidden], axis=1)
    out = model.mtp(hidden, model.embed(mx.array(s.pending_tok + [x0])[None]),
                    s.mtp_cache)[:, -1:]
    drafts, logits = [], []
    for _ in range(k):
        lg = model.draft_logits(out[:, -1])
        logits.append(np.array(lg[0], dtype=np.float64))
        d = mx.argmax(lg, axis=-1)
        drafts.append(int(d.item()))
        out = model.mtp(out, model.embed(d.reshape(1, 1)), s.mtp_cache)
    return x0, drafts, np.stack(logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_drafts_equal_the_reference_head_at_every_depth_step(family, folders, models):
    pytest.importorskip("torch")
    from tests.engine.models.families_oracle import reference_drafts

    for p in prompts(2, seed=41):
        x0, drafts, want = reference_drafts(folders[family], p, 4)
        got_x0, got, logits = _engine_drafts(models[family], p, 4)
        assert (got_x0, got) == (x0, drafts)
        # float32 rounding only: measured max 1.1e-5 at logits of ~12
        np.testing.assert_allclose(logits, want, atol=1e-5 * 10 * max(1, np.abs(want).max()))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mistake", ["swapped", "recursion"])
def test_oracle_detects_wiring_mistakes(family, mistake, folders, models):
    """The reference wired wrong (hidden first in the concat; recursion on the other side of
    the final norm: after shared_head.norm for nextn, before mtp.norm for Qwen3-Next) differs
    from the engine by far more than rounding."""
    pytest.importorskip("torch")
    from tests.engine.models.families_oracle import reference_drafts

    p = prompts(1, seed=41)[0]
    _, _, wrong = reference_drafts(folders[family], p, 3, wiring=mistake)
    _, _, logits = _engine_drafts(models[family], p, 3)
    rows = slice(0, 3) if mistake == "swapped" else slice(1, 3)  # recursion: from step 2
    assert np.abs(logits[rows] - wrong[rows]).max() > 1e-2


# --------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("family", ALL)
def test_greedy_depths_1_to_4_equal_depth_0(family, models):
    model = models[family]
    for p in prompts(2, seed=42):
        base = _tokens(model, p, depth=0, n=16)
        for d in (1, 2, 3, 4):
            assert _tokens(model, p, depth=d, n=16) == base, d
        # replayed drafts of the plain output: every draft accepted, k tokens committed
        assert _tokens(model, p, depth=4, n=16, drafter=ReplayDrafter(base)) == base


@pytest.mark.parametrize("family", ALL)
def test_streams_equal_batched_and_alone(family, models):
    model = models[family]
    # "auto" depth picks by measured time, so only greedy output is depth-independent
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.95)
    ps = prompts(4, seed=43)
    for sp, depths in ((SamplingParams(), [0, 1, 3, "auto"]), (params, [0, 1, 3, 2])):
        budgets = [12, 7, 12, 10]
        refs = [alone(model, p, depth=d, max_tokens=n, sampling=sp, seed=50 + i)
                for i, (p, d, n) in enumerate(zip(ps, depths, budgets))]
        carryover_of(model).reset_prompt_cache()
        dec = BatchDecoder(model, max_streams=6)
        streams = [dec.add(p, depth=d, max_tokens=n, sampling=sp, seed=50 + i)
                   for i, (p, d, n) in enumerate(zip(ps, depths, budgets))]
        got = batched(dec, streams)
        for s, ref in zip(streams, refs):
            assert got[s.id] == ref, (sp.temperature, s.depth)


@pytest.mark.parametrize("family", ALL)
def test_every_row_matches_a_fresh_decode_after_each_commit(family, models):
    model = models[family]
    carryover_of(model).reset_prompt_cache()
    dec = BatchDecoder(model, max_streams=3)
    for p, d in zip(prompts(3, seed=44), [1, 3, 2]):
        dec.add(p, depth=d, max_tokens=10)
    checked = 0

    def check(dec: BatchDecoder) -> None:
        nonlocal checked
        for b, st in enumerate(dec.active):
            live = dec.batch.extract(b)
            fresh = Session.fresh(model, use_mtp=True)
            fresh.prefill(list(live.fed))
            want = np.array(fresh.last_logits)
            np.testing.assert_allclose(np.array(live.last_logits), want,
                                       atol=2e-4 * np.abs(want).max())
            assert live.mtp_rows + len(live.pending_tok) == len(live.fed) - 1
            assert draft_one(live, st.x0).tolist() == draft_one(fresh, st.x0).tolist()
            checked += 1

    batched(dec, list(dec.waiting), on_step=check)
    assert checked > 10


@pytest.mark.slow  # ~2 minutes a family on this machine
@pytest.mark.parametrize("family", FAMILIES)
def test_sampled_depth2_follows_plain_decoding(family, tmp_path):
    pytest.importorskip("scipy")
    from tests.engine.decoding.test_distribution import (PROMPT, SETTINGS, V, chi_square_p,
                                                         exact_pair_distribution)

    m = engine.load(build_tiny_family(tmp_path / "m", family, vocab_size=V, hidden=32, seed=5))
    model = engine.Model(trunk=m.trunk, mtp=m.mtp, tokenizer=m.tokenizer,
                         info=dataclasses.replace(m.info, eos_token_ids=()))
    params = SETTINGS[0]
    expected = exact_pair_distribution(model, params).ravel()
    counts, accepted = np.zeros(V * V), 0
    for i in range(N_SAMPLES):
        carryover_of(model).reset_prompt_cache()
        toks = []
        for ev in model.generate(PROMPT, max_tokens=4, depth=2, sampling=params, seed=i + 1):
            toks.extend(ev.token_ids)
            accepted += ev.stats.accepted if ev.stats else 0
        counts[toks[1] * V + toks[2]] += 1
    assert chi_square_p(counts, expected) > 0.001
    assert accepted > 0


# --------------------------------------------------------------------------- broken

def _rewrite(folder, *, config=None, drop=(), reshape=()):
    from safetensors.numpy import load_file, save_file

    path = folder / "model.safetensors"
    if callable(drop):
        drop = drop(folder)
    tensors = load_file(str(path))
    for k in drop:
        tensors.pop(k)
    for k in reshape:
        tensors[k] = tensors[k][:, :-1].copy()
    save_file(tensors, str(path), metadata={"format": "pt"})
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(config)
        (folder / "config.json").write_text(json.dumps(cfg))


def _qwen3_next_mtp_layer(folder) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "np") as f:
        return [k for k in f.keys() if k.startswith("mtp.layers.0.")]


BROKEN_QWEN3_NEXT = {
    "the mtp layer missing": (dict(drop=_qwen3_next_mtp_layer), "no MTP decoder layer"),
    "mtp_num_hidden_layers 2": (dict(config={"mtp_num_hidden_layers": 2}),
                                "mtp_num_hidden_layers is 2"),
    "mtp_num_hidden_layers 0": (dict(config={"mtp_num_hidden_layers": 0}),
                                "mtp_num_hidden_layers is 0"),
    "num_nextn_predict_layers 2": (
        dict(config={"mtp_num_hidden_layers": None, "num_nextn_predict_layers": 2}),
        "num_nextn_predict_layers is 2"),
    "fc of the wrong shape": (dict(reshape=["mtp.fc.weight"]), "fc.weight"),
    "an mtp expert of the wrong shape": (
        dict(reshape=["mtp.layers.0.mlp.experts.0.up_proj.weight"]), "up_proj"),
    "an mtp attention projection of the wrong shape": (
        dict(reshape=["mtp.layers.0.self_attn.q_proj.weight"]), "q_proj"),
}
BROKEN = {
    "part of the nextn layer missing": (dict(drop=["model.layers.3.eh_proj.weight"]),
                                        "lacks eh_proj.weight"),
    "num_nextn_predict_layers 2": (dict(config={"num_nextn_predict_layers": 2}),
                                   "num_nextn_predict_layers is 2"),
    "num_nextn_predict_layers 0": (dict(config={"num_nextn_predict_layers": 0}),
                                   "num_nextn_predict_layers is 0"),
    "eh_proj of the wrong shape": (dict(reshape=["model.layers.3.eh_proj.weight"]),
                                   "eh_proj.weight"),
    "shared_head.head of the wrong shape": (
        dict(reshape=["model.layers.3.shared_head.head.weight"]), "shared_head.head.weight"),
    "a nextn expert of the wrong shape": (
        dict(reshape=["model.layers.3.mlp.experts.0.up_proj.weight"]), "up_proj"),
}


@pytest.mark.parametrize(("family", "case"), [(f, c) for f in NEXTN for c in BROKEN]
                         + [("qwen3_next", c) for c in BROKEN_QWEN3_NEXT])
def test_broken_checkpoints_end_in_one_line(family, case, tmp_path):
    how, needle = (BROKEN_QWEN3_NEXT if family == "qwen3_next" else BROKEN)[case]
    folder = build_tiny_family(tmp_path / "m", family)
    _rewrite(folder, **how)
    with pytest.raises(ModelLoadError) as err:
        engine.load(folder)
    msg = str(err.value)
    assert "\n" not in msg and needle in msg, msg
    assert len(msg) < 600


@pytest.mark.parametrize("family", FAMILIES)
def test_no_nextn_layer_loads_for_plain_decoding_with_a_note(family, tmp_path):
    model = engine.load(build_tiny_family(tmp_path / "m", family, with_mtp=False))
    assert not model.info.has_mtp and model.mtp is None
    assert ("mtp.*" if family == "qwen3_next" else "nextn") in model.info.notes[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_quantized_conversion_keeps_an_8_bit_head_and_stays_exact(family, folders, tmp_path):
    from engine.models.convert import convert

    model = engine.load(convert(folders[family], tmp_path / "q4", bits=4, group_size=32))
    assert model.info.has_mtp and model.info.quantization["bits"] == 4
    proj = model.mtp.fc if family == "qwen3_next" else model.mtp.eh_proj
    assert proj.bits == 8  # the head at >= 8 bits (MTP_SPEC §2)
    p = prompts(1, seed=45)[0]
    assert _tokens(model, p, depth=3, n=12) == _tokens(model, p, depth=0, n=12)


@pytest.mark.parametrize("family", FAMILIES)
def test_inspect_sees_the_nextn_head_and_its_memory(family, folders):
    from engine.hub.inspection import inspect_local

    report = inspect_local(folders[family])
    assert report["family"] == family and report["supported"] and report["can_speculate"]
    assert report["mtp_layers"] == 1 and report["layout"] == "hf"
    assert report["memory_needed_bytes"] > report["weight_bytes"]


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_limit_counts_the_familys_cache(family, models):
    """KV bytes per token as the family's cache holds them (MLA: latent + rotary key;
    Qwen3-Next: its full-attention layers only), at 2 bytes an element (mlx-lm's args of
    these families carry no dtype: bf16 assumed)."""
    from engine.models.prompt_limits import kv_bytes_per_token

    cfg = json.loads((Path(models[family].info.path) / "config.json").read_text())
    layers = cfg["num_hidden_layers"]
    if family == "qwen3_next":  # only the full-attention layers grow with the context
        layers //= cfg["full_attention_interval"]
    want = layers * 2 * ((cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) if "kv_lora_rank" in cfg
                         else 2 * cfg["num_key_value_heads"] * cfg["head_dim"])
    assert kv_bytes_per_token(models[family].trunk) == want


@pytest.mark.parametrize("family", FAMILIES)
def test_streaming_pull_convert_refuses_in_one_line(family, folders):
    from engine.hub.stream_convert import ShardConverter
    from engine.models.convert import ConversionError

    config = json.loads((folders[family] / "config.json").read_text())
    with pytest.raises(ConversionError, match="engine convert") as err:
        ShardConverter(config, bits=4, group_size=64)
    assert "\n" not in str(err.value) and family in str(err.value)
