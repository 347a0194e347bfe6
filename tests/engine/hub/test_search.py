"""Searching the (fake) Hub: family filter, MTP by headers, gated repos, pagination, offline."""
from __future__ import annotations

import json

import pytest

from engine.errors import HubError
from engine.hub.search import HubSearch, check, check_all, family_of
from tests.fakehub import FakeHub, FakeRepo, point_hf_at

GiB = 2**30


@pytest.fixture
def hub(repos, monkeypatch, tmp_path):
    extra = dict(repos)
    meta = {"tiny/mtp": 900, "tiny/no-mtp": 800, "tiny/gated": 700, "tiny/corrupt": 5,
            "tiny/llama": 10_000}
    for rid, n in meta.items():
        r = repos[rid]
        extra[rid] = FakeRepo(r.files, gated=r.gated, corrupt=r.corrupt,
                              meta={"downloads": n, "likes": n // 100, "license": "apache-2.0"})
    for i in range(4):  # more matches than one Hub page
        extra[f"tiny/mtp-copy{i}"] = FakeRepo(repos["tiny/mtp"].files, meta={"downloads": i})
    with FakeHub(extra) as h:
        point_hf_at(h, monkeypatch, tmp_path)
        yield h


def test_family_filter():
    assert family_of({"model_type": "qwen3_5_moe"}) == "qwen3_5_moe"
    assert family_of({"architectures": ["Qwen3_5ForCausalLM"]}) == "qwen3_5"
    assert family_of({"model_type": "llama"}) is None
    assert family_of(None, ["qwen3_5", "mlx"]) == "qwen3_5"


def test_results_are_filtered_sorted_and_checked_by_headers(hub):
    s = HubSearch("tiny", page_size=3)
    page = s.next_page()
    assert [r.repo_id for r in page] == ["tiny/mtp", "tiny/no-mtp", "tiny/gated"]  # no llama
    assert page[0].downloads == 900 and page[0].likes == 9 and page[0].license == "apache-2.0"
    assert page[2].gated == "manual" and page[0].size_bytes > 0
    files_before = sum(hub.served_for("tiny/mtp").values())
    checked = check_all(page, total_memory=64 * GiB)
    assert checked[0].has_mtp is True and checked[0].supported and checked[0].verdict
    assert checked[1].has_mtp is False
    assert checked[2].has_mtp is None and "gated" in checked[2].note
    # header-only: Range requests, far less than the weights
    ranges = [r for r in hub.requests if r["path"].startswith("/tiny/mtp/resolve/")
              and r["path"].endswith(".safetensors")]
    assert ranges and all(r["range"] for r in ranges)
    weights = sum(len(v) for k, v in hub.repos["tiny/mtp"].files.items()
                  if k.endswith(".safetensors"))
    assert sum(hub.served_for("tiny/mtp").values()) - files_before < weights / 4


def test_pagination_walks_the_hubs_link_header(hub):
    s = HubSearch("tiny", page_size=3)
    seen = []
    while s.more:
        seen += [r.repo_id for r in s.next_page()]
    assert len(seen) == len(set(seen)) == 8  # every qwen repo once, llama filtered out
    assert any("cursor" in q for q in hub.searches)  # the Hub was paged, not asked for all


def test_gated_repo_with_token_is_checked(hub, monkeypatch):
    from tests.fakehub import VALID_TOKEN

    r = next(r for r in HubSearch("gated").next_page())
    assert check(r, token=VALID_TOKEN).has_mtp is True


def test_offline_says_so_and_local_list_still_works(monkeypatch, tmp_path, capsys):
    import socket

    from engine.cli import main

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(HubError, match="models already on this machine are still listed"):
        HubSearch("qwen").next_page()
    assert main(["search", "qwen"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "still listed" in err
    assert main(["list", "--no-scan"]) == 0 and "mtp-demo" in capsys.readouterr().out


def test_hf_hub_offline_mode(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match="still listed|HF_HUB_OFFLINE"):
        HubSearch("qwen").next_page()


def test_cli_search_json_and_bad_input(hub, capsys):
    from engine.cli import main

    assert main(["search", "tiny", "--limit", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["repo_id"] for r in out["results"]] == ["tiny/mtp", "tiny/no-mtp"]
    assert out["more"] and out["results"][0]["has_mtp"] is True
    assert main(["search", "tiny", "--page", "2", "--limit", "2", "--no-check"]) == 0
    assert "tiny/gated" in capsys.readouterr().out
    assert main(["search", "tiny", "--limit", "0"]) == 2
    assert "page size" in capsys.readouterr().err
    assert main(["search", "zzz-nothing"]) == 0
    assert "No Qwen3.5/3.6 models match" in capsys.readouterr().out
