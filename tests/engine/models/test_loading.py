"""``engine.load``: every malformed input gives its error class and an actionable message, and every
supported layout (raw HF, text-only causal, MLX from mlx-lm's converter) loads to the same model.

Tiny random checkpoints (``tests.tinymodels``) are built once per module; each malformed case
works on its own copy.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import engine  # before mlx: engine picks the BLAS
from engine.errors import GenerationError, ModelLoadError, UnsupportedModelError
from tests.tinymodels import build_tiny_model

PROMPT = [5, 17, 42, 99, 7, 64, 120, 33, 250, 12, 80, 3]


def logits_of(model, ids: list[int] = PROMPT) -> np.ndarray:
    """Trunk logits [T, V] of a fresh forward, as float32."""
    import mlx.core as mx

    from engine.models import trunk

    hidden, _ = trunk.forward_hidden(model.text_model, mx.array([ids]), model.trunk.make_cache())
    return np.array(trunk.lm_head(model.text_model, hidden)[0].astype(mx.float32))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A dense, tied, raw-HF checkpoint with the MTP head (seed 0)."""
    return build_tiny_model(tmp_path_factory.mktemp("base") / "hf")


@pytest.fixture(scope="module")
def base_model(base):
    return engine.load(base)


@pytest.fixture
def copy(base, tmp_path) -> Path:
    """A private copy of ``base`` to break."""
    return Path(shutil.copytree(base, tmp_path / "broken"))


def _edit_config(folder: Path, edit) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))


def _expect(folder: Path, cls: type[Exception], *fragments: str) -> str:
    """Loading ``folder`` raises exactly ``cls`` (not a subclass the test did not ask for)
    whose message contains every fragment (case-insensitive); returns the message."""
    with pytest.raises(ModelLoadError) as info:
        engine.load(folder)
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    for frag in fragments:
        assert frag.lower() in msg.lower(), f"{frag!r} not in {msg!r}"
    return msg


# --------------------------------------------------------------------------- malformed inputs

def test_missing_folder(tmp_path):
    _expect(tmp_path / "nope", ModelLoadError, "not found", "nope")


def test_missing_config(copy):
    (copy / "config.json").unlink()
    _expect(copy, ModelLoadError, "config.json", "missing", "download")


def test_malformed_config_json(copy):
    (copy / "config.json").write_text('{"model_type": "qwen3_5", "text_config": {')
    _expect(copy, ModelLoadError, "config.json", "malformed")


def test_config_not_an_object(copy):
    (copy / "config.json").write_text("[1, 2, 3]")
    _expect(copy, ModelLoadError, "config.json", "malformed")


def test_config_missing_key(copy):
    _edit_config(copy, lambda c: c["text_config"].pop("hidden_size"))
    _expect(copy, ModelLoadError, "config.json", "hidden_size")


def test_unknown_model_type(copy):
    def edit(cfg):
        cfg["model_type"] = "llama"
        cfg["text_config"]["model_type"] = "llama"
    _edit_config(copy, edit)
    _expect(copy, UnsupportedModelError, "llama", "Qwen3.5")


def test_unknown_architecture(copy):
    _edit_config(copy, lambda c: c.update(architectures=["Qwen3_5ForTokenClassification"]))
    _expect(copy, UnsupportedModelError, "Qwen3_5ForTokenClassification", "Supported")


def test_unsupported_quantization(copy):
    _edit_config(copy, lambda c: c.update(quantization_config={"quant_method": "gptq"}))
    _expect(copy, UnsupportedModelError, "quantization", "4/8-bit")


def test_missing_safetensors(copy):
    (copy / "model.safetensors").unlink()
    _expect(copy, ModelLoadError, "No .safetensors")


def test_pickle_only_folder_is_refused(copy):
    (copy / "model.safetensors").unlink()
    # Not even a valid pickle: the engine must refuse before trying to read it.
    (copy / "pytorch_model.bin").write_bytes(b"\x80\x04 this would run code")
    msg = _expect(copy, ModelLoadError, "pytorch", "safetensors")
    assert "pickle" in msg.lower()


def test_truncated_safetensors(copy):
    path = copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    _expect(copy, ModelLoadError, "model.safetensors", "truncated", "download")


def test_safetensors_cut_inside_header(copy):
    path = copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[:200])
    _expect(copy, ModelLoadError, "model.safetensors", "download")


def test_empty_safetensors(copy):
    (copy / "model.safetensors").write_bytes(b"")
    _expect(copy, ModelLoadError, "model.safetensors", "truncated")


def test_corrupt_safetensors_header(copy):
    path = copy / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"#" * 32  # the JSON header now starts with garbage
    path.write_bytes(bytes(data))
    _expect(copy, ModelLoadError, "model.safetensors", "corrupt", "download")


def test_corrupt_header_length(copy):
    path = copy / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[0:8] = (2**40).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    _expect(copy, ModelLoadError, "model.safetensors", "corrupt")


def test_shape_mismatch_with_config(copy):
    _edit_config(copy, lambda c: c["text_config"].update(hidden_size=96))
    _expect(copy, ModelLoadError, "do not match config.json")


def test_missing_tokenizer(copy):
    (copy / "tokenizer.json").unlink()
    _expect(copy, ModelLoadError, "tokenizer", "tokenizer.json")


def test_index_naming_a_missing_shard(tmp_path):
    folder = build_tiny_model(tmp_path / "sharded", shards=3)
    (folder / "model-00002-of-00003.safetensors").unlink()
    _expect(folder, ModelLoadError, "model-00002-of-00003.safetensors", "missing shard",
            "download")


def test_index_without_weight_map(tmp_path):
    folder = build_tiny_model(tmp_path / "sharded", shards=2)
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')
    _expect(folder, ModelLoadError, "weight_map")


# --------------------------------------------------------------------------- what loads

def test_model_info_fields(base, base_model):
    info = base_model.info
    cfg = json.loads((base / "config.json").read_text())["text_config"]
    gen = json.loads((base / "generation_config.json").read_text())
    assert info.family == "qwen3_5"
    assert info.architecture == "Qwen3_5ForConditionalGeneration"
    assert info.layout == "hf"
    assert info.has_mtp and info.mtp_layers == 1 and info.max_depth >= 4
    assert info.vocab_size == cfg["vocab_size"]
    assert info.hidden_size == cfg["hidden_size"]
    assert info.num_layers == cfg["num_hidden_layers"]
    assert info.context_length == cfg["max_position_embeddings"]
    assert info.quantization is None
    assert info.dtype == "float32"
    assert info.eos_token_ids[: len(gen["eos_token_id"])] == tuple(gen["eos_token_id"])
    tok = base_model.tokenizer
    assert tok.convert_ids_to_tokens(list(info.eos_token_ids)) == ["<|im_end|>", "<|endoftext|>"]
    assert info.supports_thinking  # the template reads enable_thinking
    assert info.bytes_on_disk == sum(p.stat().st_size for p in base.iterdir() if p.is_file())
    assert info.name == base.name and Path(info.path) == base
    assert info.notes == ()
    # parameters: trunk + MTP, the vision tensor ignored, the tied LM head counted once
    from safetensors import safe_open

    with safe_open(str(base / "model.safetensors"), "np") as f:
        sizes = {k: int(np.prod(f.get_slice(k).get_shape())) for k in f.keys()}
    assert info.num_parameters == sum(n for k, n in sizes.items() if not k.startswith("model.visual."))


def test_eos_ids_come_from_generation_config(copy):
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": [4, 3]}))
    info = engine.load(copy).info
    assert info.eos_token_ids[:2] == (4, 3)


def test_thinking_support_follows_the_template(copy):
    tcfg = json.loads((copy / "tokenizer_config.json").read_text())
    tcfg["chat_template"] = ("{%- for m in messages %}{{ m['content'] }}{%- endfor %}")
    (copy / "tokenizer_config.json").write_text(json.dumps(tcfg))
    assert engine.load(copy).info.supports_thinking is False


def test_vision_weights_are_ignored_and_norms_shifted_once(base, base_model):
    """Raw HF norms are zero-centred: after loading, the trunk's and the MTP head's norm
    weights are the stored value + 1 (exactly once); GDN's gated norm is not shifted."""
    from safetensors.numpy import load_file

    raw = load_file(str(base / "model.safetensors"))
    lm = base_model.text_model.model
    np.testing.assert_allclose(np.array(lm.norm.weight),
                               raw["model.language_model.norm.weight"] + 1, atol=1e-7)
    np.testing.assert_allclose(np.array(lm.layers[0].input_layernorm.weight),
                               raw["model.language_model.layers.0.input_layernorm.weight"] + 1,
                               atol=1e-7)
    np.testing.assert_allclose(np.array(lm.layers[0].linear_attn.norm.weight),
                               raw["model.language_model.layers.0.linear_attn.norm.weight"],
                               atol=1e-7)
    head = base_model.mtp
    for name, got in [("mtp.norm.weight", head.norm.weight),
                      ("mtp.pre_fc_norm_embedding.weight", head.pre_fc_norm_embedding.weight),
                      ("mtp.pre_fc_norm_hidden.weight", head.pre_fc_norm_hidden.weight),
                      ("mtp.layers.0.input_layernorm.weight", head.layers[0].input_layernorm.weight),
                      ("mtp.layers.0.self_attn.q_norm.weight", head.layers[0].self_attn.q_norm.weight)]:
        np.testing.assert_allclose(np.array(got), raw[name] + 1, atol=1e-7, err_msg=name)


def test_hf_and_causal_layouts_give_identical_logits(base_model, tmp_path):
    causal = engine.load(build_tiny_model(tmp_path / "causal", layout="causal"))
    assert causal.info.architecture == "Qwen3_5ForCausalLM"
    assert causal.info.layout == "hf" and causal.info.has_mtp
    np.testing.assert_array_equal(logits_of(causal), logits_of(base_model))


def test_moe_loads(tmp_path):
    model = engine.load(build_tiny_model(tmp_path / "moe", moe=True))
    info = model.info
    assert info.family == "qwen3_5_moe"
    assert info.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert info.has_mtp and info.mtp_layers == 1
    logits = logits_of(model)
    assert np.isfinite(logits).all() and np.std(logits) > 0.1


def test_untied_loads_its_own_lm_head(base_model, tmp_path):
    model = engine.load(build_tiny_model(tmp_path / "untied", tied=False))
    assert not model.text_model.args.tie_word_embeddings
    assert hasattr(model.text_model, "lm_head")
    # same trunk tensors as the tied base (same seed), different head -> different logits
    assert not np.allclose(logits_of(model), logits_of(base_model), atol=1e-2)


def test_load_with_dtype_casts_but_keeps_a_log(base):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    model = engine.load(base, dtype="bfloat16")
    assert model.info.dtype == "bfloat16"
    params = dict(tree_flatten(model.trunk.parameters()))
    a_logs = [k for k in params if k.endswith("A_log")]
    assert a_logs and all(params[k].dtype == mx.float32 for k in a_logs)
    assert all(v.dtype == mx.bfloat16 for k, v in params.items() if not k.endswith("A_log"))
    assert all(v.dtype == mx.bfloat16 for _, v in tree_flatten(model.mtp.parameters()))
    assert np.isfinite(logits_of(model)).all()


# --------------------------------------------------------------------------- without an MTP head

def _finish(events) -> tuple[list[int], str | None]:
    tokens, reason = [], None
    for ev in events:
        tokens += list(ev.token_ids)
        reason = ev.finish_reason or reason
    return tokens, reason


def _assert_plain_only(model) -> None:
    assert model.info.has_mtp is False and model.info.mtp_layers == 0 and model.mtp is None
    assert model.info.max_depth == 0
    assert any("mtp" in n.lower() for n in model.info.notes)
    with pytest.raises(GenerationError, match="no MTP head.*depth 0"):
        _finish(model.generate(PROMPT, max_tokens=4, depth=2))
    with pytest.raises(GenerationError, match="no MTP head"):
        _finish(model.generate(PROMPT, max_tokens=4, depth="auto"))
    tokens, reason = _finish(model.generate(PROMPT, max_tokens=4, depth=0))
    assert 1 <= len(tokens) <= 4 and reason in ("stop", "length")


def test_model_without_mtp_decodes_plainly_only(tmp_path):
    model = engine.load(build_tiny_model(tmp_path / "nomtp", with_mtp=False))
    assert model.info.layout == "hf"
    _assert_plain_only(model)


@pytest.fixture(scope="module")
def mlx_lm_converted(base, tmp_path_factory) -> Path:
    """``mlx_lm.convert`` of the raw HF base (offline): MLX layout, mtp.* dropped."""
    from mlx_lm import convert

    out = tmp_path_factory.mktemp("mlx-lm") / "mlx"
    convert(str(base), str(out))
    return out


def test_mlx_lm_converted_model(base_model, mlx_lm_converted):
    from safetensors import safe_open

    names = []
    for path in mlx_lm_converted.glob("*.safetensors"):
        with safe_open(str(path), "np") as f:
            names += list(f.keys())
    assert names and not any(n.startswith("mtp.") for n in names)  # mlx-lm dropped the head
    model = engine.load(mlx_lm_converted)
    assert model.info.layout == "mlx"
    assert model.info.family == "qwen3_5"
    # mlx-lm already added +1 to the norms; the engine must not add it again.
    np.testing.assert_allclose(logits_of(model), logits_of(base_model), atol=1e-5, rtol=0)
    _assert_plain_only(model)
