"""The catalog's entries for the nextn / Qwen3-Next families hold exactly what
``tests/catalog_sizes.py`` computes from their published configs, and that computation counts
what a checkpoint of each family really stores (checked on the tiny on-disk layouts)."""
from __future__ import annotations

import math

import pytest

from engine.hub import catalog
from tests import catalog_sizes
from tests.tinyfamilies import FAMILIES, tiny_config, tiny_family_weights

GiB = 2**30


@pytest.fixture(scope="module")
def entries() -> dict:
    return {m["repo_id"]: m for m in catalog.load_catalog()["models"]}


@pytest.mark.parametrize("repo", list(catalog_sizes.REPOS))
def test_catalog_entry_equals_what_the_generator_computes(entries, repo):
    assert repo in entries, f"{repo} missing: python -m tests.catalog_sizes --json"
    assert entries[repo] == catalog_sizes.sizes(repo)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_count_matches_a_real_checkpoint_layout(family):
    """The meta-device count plus the MTP layer = the elements the tiny raw checkpoint stores
    (per-expert tensors, router bias, nextn copies or ``mtp.*``)."""
    cfg = tiny_config(family)
    stored = tiny_family_weights(cfg)
    counted = catalog_sizes.checkpoint_shapes(cfg)
    assert sum(math.prod(s) for s in counted.values()) == sum(w.size for w in stored.values())
    copies = {n for n in counted if catalog_sizes._is_copy(n)}
    assert copies == ({n for n in stored if n.endswith(("shared_head.head.weight",
                                                         ".embed_tokens.weight"))
                       and n.startswith("model.layers.")})


def test_deepseek_download_is_fp8_plus_scales():
    e = catalog_sizes.sizes("deepseek-ai/DeepSeek-V3.1")
    total = e["parameters_b"] * 1e9
    download = e["quantizations"]["bf16"]["download_bytes"]
    assert 1.0 * total < download < 1.1 * total  # ~1 byte a weight, not bf16's 2
    glm = catalog_sizes.sizes("zai-org/GLM-4.5")
    assert glm["quantizations"]["bf16"]["download_bytes"] == pytest.approx(
        2 * glm["parameters_b"] * 1e9, rel=0.01)


def test_verdicts_on_a_24_gb_machine(entries):
    cat = catalog.catalog_for_machine(total_mem=24 * GiB, free_fn=lambda p: 10**13,
                                      store_root="/tmp")
    got = {m["repo_id"]: (m["verdict"], m["best_quantization"]) for m in cat["models"]}
    for repo in catalog_sizes.REPOS:
        if repo != "zai-org/GLM-4.7-Flash":
            assert got[repo] == ("not enough memory", "4bit"), repo
    assert got["zai-org/GLM-4.7-Flash"] == ("tight fit", "4bit")  # 19.9 GB of 25.8


def test_moe_speed_uses_the_counted_active_parameters(entries):
    glm = entries["zai-org/GLM-4.5"]
    assert catalog.active_fraction(glm) == glm["active_parameters_b"] / glm["parameters_b"] < 0.1
    qwen = entries["Qwen/Qwen3.5-35B-A3B"]  # no count: the name's "A3B"
    assert catalog.active_fraction(qwen) == pytest.approx(3 / 35.91)
