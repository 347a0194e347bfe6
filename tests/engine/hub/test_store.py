"""The model store, catalog verdicts and local inspection (no network)."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.errors import ModelLoadError, StoreError
from engine.hub import catalog, store
from engine.hub.inspection import inspect_local, parse_header, read_header
from engine.hub.store import Store
from tests.tinymodels import build_tiny_model

GiB = 2**30


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def _install(st: Store, src, name: str) -> str:
    import shutil

    staging = st.staging_path(name)
    shutil.copytree(src, staging)
    files = {p.name: {"size": p.stat().st_size} for p in staging.iterdir() if p.is_file()}
    info = inspect_local(staging)
    return str(st.install(staging, name, {"repo_id": f"org/{name}", "revision": "main",
                                          "files": files, "summary": {
                                              k: info[k] for k in ("family", "quantization",
                                                                   "has_mtp")}}))


def test_root_follows_home_and_user_setting(tmp_path):
    assert store.store_root() == tmp_path / "home" / "data" / "models"
    store.set_store_root(tmp_path / "elsewhere")
    assert store.store_root() == (tmp_path / "elsewhere").resolve()
    assert Store().root == (tmp_path / "elsewhere").resolve()
    store.set_store_root(None)
    assert store.store_root() == tmp_path / "home" / "data" / "models"
    assert Store(tmp_path / "x").root == tmp_path / "x"


def test_builtin_demo_is_listed_and_cannot_be_deleted(tmp_path):
    st = Store(tmp_path / "models")
    rows = st.list()
    demo = rows[0]
    assert demo.status == "builtin" and demo.read_only and not demo.deletable
    with pytest.raises(StoreError, match="built into the app"):
        st.delete(demo.name)


def test_install_list_and_delete(tmp_path, tiny):
    st = Store(tmp_path / "models")
    path = _install(st, tiny, "org--tiny")
    row = st.get("org--tiny")
    assert row.status == "installed" and row.path == path and row.loadable
    assert (row.family, row.has_mtp, row.quantization) == ("qwen3_5", True, None)
    assert row.size_bytes > 100_000 and row.repo_id == "org/org--tiny"
    assert not st.staging_path("org--tiny").exists()
    st.delete("org--tiny")
    assert st.get("org--tiny") is None and not (tmp_path / "models" / "org--tiny").exists()


def test_corrupt_and_unverified_installs_are_reported(tmp_path, tiny):
    import shutil

    st = Store(tmp_path / "models")
    path = _install(st, tiny, "a")
    weights = next(p for p in (tmp_path / "models" / "a").glob("*.safetensors"))
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size - 10)
    row = st.get("a")
    assert row.status == "corrupt" and "expected" in row.problem and not row.loadable
    weights.unlink()
    assert "missing file" in st.get(path).problem
    shutil.copytree(tiny, tmp_path / "models" / "handmade")
    row = st.get("handmade")
    assert row.status == "unverified" and row.has_mtp is True and row.loadable
    (tmp_path / "models" / "junk").mkdir()
    assert st.get("junk").status == "corrupt"


def test_incomplete_download_is_listed_with_its_target_size(tmp_path):
    st = Store(tmp_path / "models")
    staging = st.staging_path("org--big")
    store.write_json_atomic(staging / ".mtpchat" / "download.json", {
        "repo_id": "org/big", "revision": "main",
        "files": [{"path": "a.safetensors", "size": 1000}, {"path": "config.json", "size": 20}]})
    (staging / "a.safetensors.part").write_bytes(b"x" * 300)
    row = st.get("org--big")
    assert row.status == "incomplete" and row.bytes_total == 1020 and row.repo_id == "org/big"
    assert "resume" in row.problem and not row.loadable
    st.delete("org--big")
    assert not staging.exists()


def test_delete_refuses_paths_outside_the_store(tmp_path, tiny):
    st = Store(tmp_path / "models")
    with pytest.raises(StoreError, match="no model named"):
        st.delete(str(tiny))
    assert tiny.is_dir()


def test_last_used_and_tuning_are_per_model_and_machine(tmp_path, tiny):
    assert store.last_used(tiny) is None
    store.mark_used(tiny, when=1234.5)
    assert store.last_used(tiny) == 1234.5
    assert store.read_tuned_depth(tiny) is None
    store.write_tuned(tiny, {"best_depth": 3, "tokens_per_second": {"0": 10, "3": 21}})
    assert store.read_tuned_depth(tiny) == 3
    assert store.read_tuned(tiny)["tokens_per_second"]["3"] == 21
    assert store.read_tuned_depth(tiny, machine="another-mac") is None
    with pytest.raises(StoreError):
        store.write_tuned(tiny, [3])
    st = Store(tmp_path / "models")
    _install(st, tiny, "t")
    store.write_tuned(st.path_for("t"), {"best_depth": 2})
    assert st.get("t").tuned_depth == 2


def test_tuning_and_warm_figures_follow_the_weights_not_the_folder(tmp_path, tiny):
    """A model whose weights change in place (a new revision, a retrained demo shipped by an
    app update) is measured afresh: what was kept for the old weights is not read for the new
    ones, and an entry from before signatures existed is not trusted either."""
    import json
    import os
    import shutil

    model = tmp_path / "copy"
    shutil.copytree(tiny, model)
    store.write_tuned(model, {"best_depth": 4})
    store.write_warm_hint(model, "float32", {"cost": {"1": {"3": 0.01}}, "acceptance": [0.9]})
    assert store.read_tuned_depth(model) == 4
    assert store.read_warm_hint(model, "float32")["acceptance"] == [0.9]
    weights = next(model.glob("*.safetensors"))
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # rewritten
    assert store.read_tuned_depth(model) is None
    assert store.read_warm_hint(model, "float32") is None
    store.write_tuned(model, {"best_depth": 2})
    assert store.read_tuned_depth(model) == 2
    tuning = store.data_dir() / "tuning.json"
    data = json.loads(tuning.read_text())
    for entry in data[str(model.resolve())].values():
        del entry["weights"]  # as an older version wrote it
    tuning.write_text(json.dumps(data))
    assert store.read_tuned_depth(model) is None


def test_model_name():
    assert store.model_name("Qwen/Qwen3.5-4B") == "Qwen--Qwen3.5-4B"
    assert store.model_name("Qwen/Qwen3.5-4B", revision="v2", suffix="mlx-4bit") == \
        "Qwen--Qwen3.5-4B--v2-mlx-4bit"
    with pytest.raises(StoreError):
        store.model_name("a/b:c")


# ----------------------------------------------------------------------------- inspect


def test_inspect_local_raw_hf_layout(tiny):
    r = inspect_local(tiny)
    header = read_header(next(tiny.glob("*.safetensors")))
    assert r["family"] == "qwen3_5" and r["layout"] == "hf" and r["has_mtp"] is True
    assert r["mtp_layers"] == 1 and r["supported"] and r["can_speculate"] and r["fix"] is None
    assert r["parameters"] == sum(int(np.prod(m["shape"])) for m in header.values())
    assert r["weight_bytes"] < r["bytes"]  # the vision tensor is not counted
    assert r["machine"]["verdict"] == "recommended"


def test_inspect_local_causal_layout_without_mtp(tmp_path):
    path = build_tiny_model(tmp_path / "c", layout="causal", with_mtp=False, moe=True)
    r = inspect_local(path)
    assert (r["family"], r["layout"], r["has_mtp"], r["can_speculate"]) == \
        ("qwen3_5_moe", "hf", False, False)
    assert r["supported"] and "--convert --bits 4" in r["fix"]


def _write_model(path, config: dict, tensors: dict) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))


def test_inspect_local_quantized_mlx_layout(tmp_path):
    cfg = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "quantization": {"group_size": 64, "bits": 4},
           "text_config": {"model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1}}
    t = {"language_model.model.layers.0.linear_attn.conv1d.weight": np.zeros((96, 4, 1), np.float16),
         "language_model.model.layers.0.mlp.up_proj.weight": np.zeros((128, 8), np.uint32),
         "language_model.model.layers.0.mlp.up_proj.scales": np.zeros((128, 1), np.float16),
         "language_model.model.layers.0.mlp.up_proj.biases": np.zeros((128, 1), np.float16),
         "mtp.fc.weight": np.zeros((4, 8), np.float16)}
    _write_model(tmp_path / "q", cfg, t)
    r = inspect_local(tmp_path / "q")
    assert r["layout"] == "mlx" and r["quantization"]["bits"] == 4 and r["has_mtp"]
    assert r["parameters"] == 96 * 4 + 128 * 8 * 8 + 32


def test_inspect_flags_unsupported_models(tmp_path):
    _write_model(tmp_path / "llama", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
                 {"model.embed_tokens.weight": np.zeros((4, 4), np.float32)})
    r = inspect_local(tmp_path / "llama")
    assert not r["supported"] and "not supported" in r["reasons"][0]
    _write_model(tmp_path / "gptq", {"architectures": ["Qwen3_5ForCausalLM"],
                                     "quantization_config": {"quant_method": "gptq"}},
                 {"mtp.fc.weight": np.zeros((4, 4), np.float32)})
    r = inspect_local(tmp_path / "gptq")
    assert not r["supported"] and "gptq" in " ".join(r["reasons"])
    with pytest.raises(ModelLoadError, match="config.json"):
        inspect_local(tmp_path)


def test_parse_header_rejects_garbage():
    with pytest.raises(ModelLoadError):
        parse_header(b"abc")
    with pytest.raises(ModelLoadError, match="truncated"):
        parse_header(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ModelLoadError, match="plausible"):
        parse_header(struct.pack("<Q", 2**40) + b"{}")


# ----------------------------------------------------------------------------- catalog

def test_catalog_lists_the_official_repos():
    repos = {m["repo_id"] for m in catalog.load_catalog()["models"]}
    for size in ("0.8B", "2B", "4B", "9B", "27B", "35B-A3B"):
        assert f"Qwen/Qwen3.5-{size}" in repos
    assert {"Qwen/Qwen3.6-27B", "Qwen/Qwen3.6-35B-A3B"} <= repos
    for m in catalog.load_catalog()["models"]:
        q = m["quantizations"]
        assert q["bf16"]["memory_bytes"] > q["8bit"]["memory_bytes"] > q["4bit"]["memory_bytes"]
        assert not q["bf16"]["needs_conversion"] and q["4bit"]["needs_conversion"]


def _verdicts(mem: int, free: int) -> dict:
    cat = catalog.catalog_for_machine(total_mem=mem, free_fn=lambda p: free, store_root="/tmp")
    return {m["repo_id"]: (m["verdict"], m["best_quantization"]) for m in cat["models"]}


def test_catalog_verdicts_follow_memory_and_disk():
    big = _verdicts(4096 * GiB, 10**13)  # DeepSeek-V3 in bf16 needs 1.5 TB
    assert all(v == ("recommended", "bf16") for v in big.values())
    small = _verdicts(8 * GiB, 10**13)
    assert small["Qwen/Qwen3.5-0.8B"] == ("recommended", "bf16")
    assert small["Qwen/Qwen3.5-4B"][0] in ("recommended", "tight fit")
    assert small["Qwen/Qwen3.5-27B"] == ("not enough memory", "4bit")
    no_disk = _verdicts(512 * GiB, 3 * 10**9)
    assert no_disk["Qwen/Qwen3.5-27B"][0] == "not enough disk"
    assert no_disk["Qwen/Qwen3.5-0.8B"] == ("recommended", "bf16")


def test_memory_verdict_thresholds():
    assert catalog.memory_verdict(6 * GiB, total_memory=10 * GiB)["verdict"] == "recommended"
    assert catalog.memory_verdict(8 * GiB, total_memory=10 * GiB)["verdict"] == "tight fit"
    assert catalog.memory_verdict(9 * GiB, total_memory=10 * GiB)["verdict"] == "not enough memory"


def test_known_repos_without_mtp_are_warned_about():
    assert "drops the mtp" in catalog.warning_for("mlx-community/Qwen3.5-4B-4bit")
    assert catalog.warning_for("Qwen/Qwen3.5-4B") is None
