"""The same faults through the Python API and the store (no child process needed)."""
from __future__ import annotations

import shutil

import pytest

import engine
from engine.errors import ModelLoadError
from tests.reliability import broken
from tests.reliability.cases import NESTED_LOOPS
from tests.reliability.conftest import make_variant


@pytest.mark.parametrize("edit,field", [
    (broken.set_text(num_attention_heads=0), "num_attention_heads"),
    (broken.set_text(vocab_size=10**12), "vocab_size"),
    (broken.set_top(quantization=4), "quantization"),
    (broken.header_nested, "nested"),
    (broken.set_text(eos_token_id=10**9), "config.json: eos_token_id"),
    (broken.set_generation(eos_token_id=[2, 320]), "generation_config.json: eos_token_id"),
    (broken.both(broken.set_text(hidden_size=-1), broken.remove("tokenizer.json")),
     "hidden_size"),
], ids=["heads-0", "vocab-1e12", "quantization-4", "header-nested", "eos-1e9", "eos-past-tokenizer",
    "config-before-tokenizer"])
def test_load_names_the_field(bases, tmp_path, edit, field):
    folder = make_variant(bases, tmp_path, "tiny", edit)
    with pytest.raises(ModelLoadError, match=field):
        engine.load(folder)


def test_load_refuses_a_shard_outside_the_folder(bases, tmp_path):
    folder = make_variant(bases, tmp_path, "sharded", broken.index_entry("../x.safetensors"))
    with pytest.raises(ModelLoadError, match="outside the model folder"):
        engine.load(folder)


def test_store_lists_no_partial_or_broken_folder_as_loadable(bases, tmp_path):
    from engine.hub.store import Store

    st = Store(tmp_path / "models")
    shutil.copytree(bases["tiny"], st.staging_path("org--downloading"))
    make_variant(bases, tmp_path / "models" / "hand", "tiny", broken.truncate_shard)
    shutil.move(str(tmp_path / "models" / "hand" / "m"), tmp_path / "models" / "handmade")
    shutil.copytree(bases["tiny"], tmp_path / "models" / "good")
    heads = make_variant(bases, tmp_path / "h", "tiny", broken.set_top(
        architectures=["LlamaForCausalLM"]))
    shutil.copytree(heads, tmp_path / "models" / "llama")
    loadable = {r.name for r in st.loadable()}
    assert "good" in loadable and "org--downloading" not in loadable
    assert not loadable & {"handmade", "llama", "hand"}
    rows = {r.name: r for r in st.list()}
    assert rows["handmade"].status == "corrupt" and "truncated" in rows["handmade"].problem
    assert rows["llama"].status == "unsupported"
    assert rows["org--downloading"].status == "incomplete"


def test_resolver_and_mark_used(bases, tmp_path, monkeypatch):
    from engine.hub import store
    from engine.hub.store import Store
    from tests.reliability.conftest import _install

    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    st = Store()
    st.ensure()
    _install(st.root, bases["tiny"], "acme--x", "acme/x")
    assert st.resolve("acme/x") == st.root / "acme--x" == st.resolve("acme--x")
    assert st.resolve(str(bases["tiny"])) == bases["tiny"]
    assert st.resolve(engine.default_model_path().name) == engine.default_model_path()
    with pytest.raises(ModelLoadError, match="Model folder not found"):
        st.resolve("acme/unknown")
    st.mark_used("acme/x", when=42.0)
    assert store.last_used(st.root / "acme--x") == 42.0 == st.get("acme--x").last_used
    assert engine.load("acme/x").info.name == "acme--x"


def test_chat_ids_budget(bases, tmp_path):
    from engine.errors import ChatTemplateError

    folder = make_variant(bases, tmp_path, "tiny", broken.chat_template(NESTED_LOOPS))
    model = engine.load(folder)
    with pytest.raises(ChatTemplateError, match="did not finish"):
        model.chat_ids([{"role": "user", "content": "hi"}])
