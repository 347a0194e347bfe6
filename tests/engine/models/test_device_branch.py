"""The device branch switch (engine/models/device.py): one place picks the code the trunk and
MTP forwards run, and both branches give the same results (within float rounding on a CPU)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import engine  # noqa: F401  (loads the BLAS before mlx)
import mlx.core as mx

from engine import SamplingParams
from engine.models import device, mtp as engine_mtp, trunk
from engine.core.carryover import carryover_of

ON_CPU = mx.default_device() == mx.cpu


def _same(a: mx.array, b: mx.array, what: str) -> None:
    a, b = np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
    if ON_CPU:  # the "metal" branch on a CPU is the ops path: the same arithmetic, except
        # the CPU branch's attention folds the query heads onto their KV heads (another
        # summation order: float rounding, tests/engine/models/test_cpu_attention.py)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(b).max()),
                                   err_msg=what)
    else:       # on a GPU it is mlx-lm's kernel: float rounding apart
        np.testing.assert_allclose(a, b, atol=2e-3 * max(1.0, np.abs(b).max()), err_msg=what)


def test_branch_comes_from_the_override_then_the_environment_then_the_device():
    saved = os.environ.get(device.ENV_VAR)
    try:
        os.environ.pop(device.ENV_VAR, None)
        assert device.reload_env() is None
        assert device.branch() == ("cpu" if ON_CPU else "metal")
        os.environ[device.ENV_VAR] = " Metal "
        assert device.reload_env() == "metal" and device.branch() == "metal"
        assert not device.is_cpu()
        with device.use_branch("cpu") as name:
            assert name == "cpu" and device.is_cpu()
            with device.use_branch("metal"):
                assert device.branch() == "metal"
            assert device.branch() == "cpu"
        assert device.branch() == "metal"
        os.environ[device.ENV_VAR] = "gpu"
        with pytest.raises(ValueError, match="MTPCHAT_DEVICE_BRANCH"):
            device.reload_env()
        with pytest.raises(ValueError, match="cpu, metal"):
            device.set_branch("cuda")
    finally:
        if saved is None:
            os.environ.pop(device.ENV_VAR, None)
        else:
            os.environ[device.ENV_VAR] = saved
        device.reload_env()
    assert device.set_branch(None) is None


class _Spy:
    """Counts the compiled per-layer functions made or called and the recurrence kinds run."""

    def __init__(self, monkeypatch):
        self.compiled = 0
        self.kernel_path = 0
        self.step_ops = 0
        real_on, real_captured = trunk.compiled_on, trunk._compiled_captured
        real_update, real_ops = trunk.gated_delta_update, trunk._split_steps

        def on(*a, **kw):
            self.compiled += 1
            return real_on(*a, **kw)

        def captured(*a, **kw):
            self.compiled += 1
            return real_captured(*a, **kw)

        def update(*a, **kw):
            self.kernel_path += 1
            return real_update(*a, **kw)

        def ops(*a, **kw):
            self.step_ops += 1
            return real_ops(*a, **kw)
        for mod in (trunk, engine_mtp):
            monkeypatch.setattr(mod, "compiled_on", on)
        monkeypatch.setattr(trunk, "_compiled_captured", captured)
        monkeypatch.setattr(trunk, "gated_delta_update", update)
        monkeypatch.setattr(trunk, "_split_steps", ops)


def _compiled_attributes(model) -> set[str]:
    names = set()
    for part in (model.trunk, model.mtp):
        for _, module in part.named_modules():
            names |= {k for k in module.__dict__ if k.startswith("_mtpchat_")}
    return names


def _replies(model) -> list[list[int]]:
    rng = np.random.default_rng(41)
    out = []
    for p in [rng.integers(3, 380, size=n).tolist() for n in (5, 17, 31)]:
        for depth, kw in ((0, {}), (3, {}), (2, dict(sampling=SamplingParams(temperature=0.9,
                                                                             top_k=20), seed=3))):
            carryover_of(model).reset_prompt_cache()
            toks = []
            for ev in model.generate(p, max_tokens=20, depth=depth, **kw):
                toks.extend(ev.token_ids)
            out.append(toks)
    return out


def test_metal_branch_never_makes_or_calls_the_compiled_functions(tiny_dir, monkeypatch):
    """On "metal" a fresh model decodes (plain, speculative, sampled) without one compiled
    per-layer function and with mlx-lm's ``gated_delta_update``; on "cpu" the same model then
    makes and calls them and never calls ``gated_delta_update``; the tokens are the same."""
    model = engine.load(tiny_dir)
    spy = _Spy(monkeypatch)
    with device.use_branch("metal"):
        metal = _replies(model)
    assert spy.compiled == 0 and spy.step_ops == 0 and spy.kernel_path > 0
    assert _compiled_attributes(model) == set()
    spy.kernel_path = 0
    with device.use_branch("cpu"):
        cpu = _replies(model)
    assert spy.compiled > 0 and spy.step_ops > 0 and spy.kernel_path == 0
    assert {"_mtpchat_layer", "_mtpchat_attn_in", "_mtpchat_attn_out",
            "_mtpchat_fc"} <= _compiled_attributes(model)
    spy.compiled = spy.step_ops = 0
    with device.use_branch("metal"):  # the compiled functions now exist: still not used
        again = _replies(model)
    assert spy.compiled == 0 and spy.step_ops == 0 and spy.kernel_path > 0
    assert metal == again
    if ON_CPU:  # bit-identical forwards (on a GPU the kernel's rounding may move a sample)
        assert metal == cpu


def _verify_forwards(model, rows: int) -> list[mx.array]:
    """A prefill, two verify forwards (capture) over 4 and 2 tokens, a decode step, and the
    MTP head over the verified positions: logits, captured states and caches."""
    tm = model.text_model
    rng = np.random.default_rng(rows)
    ids = mx.array(rng.integers(3, 380, size=(rows, 17)))
    cache = model.trunk.make_cache()
    out = []
    h, _ = trunk.forward_hidden(tm, ids[:, :9], cache)
    out.append(trunk.lm_head(tm, h))
    mtp_cache = model.mtp.make_cache()
    for a, b, capture in ((9, 13, True), (13, 15, True), (15, 16, False)):
        h, caps = trunk.forward_hidden(tm, ids[:, a:b], cache, capture=capture)
        out.append(trunk.lm_head(tm, h))
        out += [s for cap in caps.values() for s in cap.conv + cap.state]
        emb = tm.model.embed_tokens(ids[:, a + 1:b + 1])
        out.append(trunk.lm_head(tm, model.mtp(h, emb, mtp_cache)))
    out += [x for c in cache for x in c.state if isinstance(x, mx.array)]
    mx.eval(out)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 3])
def test_branches_give_the_same_verify_and_mtp_forwards(tiny_model, dtype, rows, monkeypatch):
    """The code that differs per branch for a verify and the MTP head. The CPU branch's
    prefill runs its recurrence in chunks (tests/engine/models/test_gdn_chunked.py: equal up
    to rounding); here both prefill step by step, so what follows differs only by the folded
    attention's summation order."""
    monkeypatch.setattr(trunk, "CHUNKED_PREFILL_MIN", 10 ** 9)
    model = tiny_model if dtype == "float32" else engine.load(tiny_model.info.path, dtype=dtype)
    with device.use_branch("cpu"):
        cpu = _verify_forwards(model, rows)
    with device.use_branch("metal"):
        metal = _verify_forwards(model, rows)
    assert len(cpu) == len(metal) > 10
    for i, (a, b) in enumerate(zip(cpu, metal)):
        _same(b, a, f"output {i}")


PARITY_CASES = ["dense_tied", "moe_untied_causal"]


@pytest.mark.parametrize("case", PARITY_CASES)
def test_both_branches_match_transformers_in_prefill_verify_and_mtp(case, tmp_path_factory):
    """test_reference_parity's oracle (transformers' float32 forward, float64 for the
    rounding criterion) against each branch's verify forwards (capture: the code that differs
    per branch) after a prefill, and the MTP head: within its tolerance."""
    torch = pytest.importorskip("torch")  # noqa: F841
    from tests.engine.models import test_reference_parity as parity

    kwargs = parity.CASES[case]
    folder = parity.build_parity_model(tmp_path_factory.mktemp(case), **kwargs)
    model = engine.load(folder)
    ids = parity.prompt_ids(model.info.vocab_size, kwargs.get("seed", 0))
    ref32 = parity.torch_reference(folder, ids)
    ref64 = parity.torch_reference(folder, ids, dtype=parity.torch.float64)
    tm = model.text_model
    for name in device.BRANCHES:
        with device.use_branch(name):
            cache, hs = model.trunk.make_cache(), []
            for a, b, capture in ((0, 8, False), (8, 12, True), (12, 13, False),
                                  (13, 17, True), (17, 20, True)):
                h, _ = trunk.forward_hidden(tm, mx.array([ids[a:b]]), cache, capture=capture)
                hs.append(h)
            hidden = mx.concatenate(hs, axis=1)
            logits = np.array(trunk.lm_head(tm, hidden)[0])
            emb = tm.model.embed_tokens(mx.array([ids[1:]]))
            mtp = np.array(trunk.lm_head(tm, model.mtp(hidden[:, :-1], emb,
                                                       model.mtp.make_cache()))[0])
        parity.assert_matches(logits, ref32[0], ref64[0], f"{case} trunk ({name})")
        parity.assert_matches(mtp, ref32[1], ref64[1], f"{case} MTP ({name})")
