"""Checking a repo before download: only the file list, config.json, index and headers."""
from __future__ import annotations

import pytest

from engine.hub import client as hub
from engine.hub.inspection import inspect_local, inspect_repo
from tests.fakehub import VALID_TOKEN, FakeHub, point_hf_at, tiny_repos


def _weights_fetched(fake, repo_id: str, repos) -> int:
    return sum(n for p, n in fake.served_for(repo_id).items() if p.endswith(".safetensors"))


def test_repo_with_mtp_is_supported_and_matches_local_inspection(fake, repos, tmp_path):
    r = inspect_repo("tiny/mtp")
    assert (r["family"], r["layout"], r["has_mtp"], r["supported"], r["can_speculate"]) == \
        ("qwen3_5", "hf", True, True, True)
    assert r["commit"] == repos["tiny/mtp"].sha and r["fix"] is None
    local = tmp_path / "local"
    local.mkdir()
    for name, data in repos["tiny/mtp"].files.items():
        (local / name).write_bytes(data)
    ref = inspect_local(local)
    for key in ("parameters", "bytes", "weight_bytes", "memory_needed_bytes", "mtp_layers"):
        assert r[key] == ref[key], key
    assert r["download_bytes"] == sum(len(b) for b in repos["tiny/mtp"].files.values())
    # Only headers were read: a few KB of each multi-hundred-KB shard.
    assert 0 < _weights_fetched(fake, "tiny/mtp", repos) < 40_000
    assert all(q["range"] for q in fake.requests if q["path"].endswith(".safetensors"))


def test_repo_without_mtp_gets_the_conversion_hint(fake):
    r = inspect_repo("tiny/no-mtp")
    assert r["supported"] and not r["has_mtp"] and not r["can_speculate"]
    assert "cannot speculate" in " ".join(r["reasons"])
    assert r["fix"].startswith("convert from the official Qwen repo: python -m engine pull")
    assert r["fix"].endswith("--convert --bits 4")


def test_unsupported_architecture(fake):
    r = inspect_repo("tiny/llama")
    assert not r["supported"] and r["family"] is None
    assert "LlamaForCausalLM" in r["reasons"][0]


def test_gated_and_missing_repos(fake, monkeypatch):
    with pytest.raises(hub.GatedRepoError, match="HF_TOKEN"):
        inspect_repo("tiny/gated")
    assert inspect_repo("tiny/gated", token=VALID_TOKEN)["can_speculate"]
    with pytest.raises(hub.RepoNotFoundError):
        inspect_repo("nobody/nothing")
    with pytest.raises(hub.RevisionNotFoundError):
        inspect_repo("tiny/mtp", revision="nope")


def test_listing_pins_the_commit_and_gives_hashes(fake, repos):
    listing = hub.list_repo("tiny/mtp")
    assert listing.commit == repos["tiny/mtp"].sha
    shard = listing.file("model-00001-of-00002.safetensors")
    assert shard.sha256 and len(shard.sha256) == 64 and shard.git_oid is None
    cfg = listing.file("config.json")
    assert cfg.sha256 is None and len(cfg.git_oid) == 40
