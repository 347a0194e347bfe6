"""``engine graft`` against the fake Hub (a real HTTP server): the demo's raw repo and tiny
random dense / MoE repos of the real layout, each with ``mtp.*``; their headless
``mlx_lm.convert`` conversions (4- and 8-bit) in a fake Hugging Face cache and a fake LM Studio
folder. Only the head's byte ranges are fetched, the trunk is proved before any head byte,
a killed graft resumes, other apps' folders are never written, refusals are one line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import engine
from engine.hub import client as hub
from engine.hub.graft import GraftError, graft
from engine.hub.graft_fetch import plan_spans
from engine.hub.graft_head import measure_acceptance
from engine.hub.graft_source import read_source
from engine.hub.store import Store
from engine.types import SamplingParams
from tests.fakehub import FakeHub, FakeRepo, point_hf_at, subprocess_env
from tests.graftrepos import (DEMO_REPO, DENSE_REPO, MOE_REPO, OTHER_REPO, CARD, conversion,
                              fake_repos, raw_sources, tree_hashes)
from tests.localdisk import make_hf_cache, make_lmstudio, point_at

SHORT = {DEMO_REPO: "mtp-demo", DENSE_REPO: "tiny-dense", MOE_REPO: "tiny-moe"}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return raw_sources(tmp_path_factory.mktemp("graft-src"))


@pytest.fixture(scope="module")
def conversions(sources, tmp_path_factory):
    base = tmp_path_factory.mktemp("graft-conv")
    return {(repo, bits): conversion(sources[repo], base / f"{SHORT[repo]}-{bits}bit", bits=bits)
            for repo in SHORT for bits in (4, 8)}


@pytest.fixture(scope="module")
def engine_convert_acceptance(tmp_path_factory):
    """``acceptance(bits)``: the demo converted by this engine's own ``convert`` at ``bits``,
    head kept (8-bit). A graft onto a b-bit conversion is compared with the b-bit one: the
    trunk's quantization decides the greedy text the head is measured on (~100 drafts), and
    an 8-bit graft measured 0.748 against 0.790 for the 4-bit conversion with the demo of
    2026-12-06."""
    import functools

    from engine.models.convert import convert

    @functools.cache
    def acceptance(bits: int) -> float:
        out = convert(engine.default_model_path(),
                      tmp_path_factory.mktemp("own") / f"demo-{bits}bit", bits=bits)
        return measure_acceptance(out)[0]

    return acceptance


@pytest.fixture
def env(sources, conversions, tmp_path, monkeypatch):
    repos = fake_repos(sources)
    for (repo, bits), conv in conversions.items():  # as mlx-community uploads them
        files = {p.name: p.read_bytes() for p in conv.iterdir() if p.is_file()}
        files["README.md"] = CARD.format(repo=repo).encode()
        repos[f"mlx-community/{SHORT[repo]}-{bits}bit"] = FakeRepo(files)
    with FakeHub(repos) as h:
        point_hf_at(h, monkeypatch, tmp_path)
        roots = point_at(monkeypatch, tmp_path)
        yield {"hub": h, "roots": roots, "store": Store(tmp_path / "store"), "tmp": tmp_path,
               "conv": conversions}


def place(env, repo: str, bits: int, kind: str):
    """The conversion where another app keeps it: the HF cache (no card on disk, as mlx-lm
    downloads it) or LM Studio (the card beside it)."""
    name = f"mlx-community/{SHORT[repo]}-{bits}bit"
    conv = env["conv"][(repo, bits)]
    if kind == "hf":
        import shutil

        bare = env["tmp"] / "bare" / name
        shutil.copytree(conv, bare, ignore=shutil.ignore_patterns("README.md"))
        return make_hf_cache(env["roots"]["hf"], name, bare), env["roots"]["hf"]
    folder = make_lmstudio(env["roots"]["lmstudio"], name, conv)
    (folder / "README.md").write_text(CARD.format(repo=repo))
    return folder, env["roots"]["lmstudio"]


def greedy(model, depth: int, n: int = 24) -> list[int]:
    ids = model.chat_ids([{"role": "user", "content": "What does json.dumps do?"}])
    events = model.generate(ids, max_tokens=n, depth=depth, sampling=SamplingParams(temperature=0))
    return [t for e in events for t in e.token_ids]


def head_ranges(env, repo: str) -> list[tuple[str, int, int]]:
    """The byte ranges of ``repo``'s shards that hold the head."""
    src = read_source(repo)
    env["hub"].reset_counts()
    return [(s.file, s.start, s.end) for s in plan_spans(src)]


def fetched_head_bytes(env, repo: str, spans) -> int:
    """Head bytes the fake Hub was asked for (from the Range headers it received)."""
    total = 0
    for r in env["hub"].requests:
        if f"/{repo}/resolve/" not in r["path"] or not r.get("range") or r["method"] != "GET":
            continue
        a, _, b = r["range"][6:].partition("-")
        a, b = int(a), int(b) + 1
        path = r["path"].split("/resolve/", 1)[1].split("/", 1)[1]
        for f, s, e in spans:
            if f == path:
                total += max(0, min(b, e) - max(a, s))
    return total


CASES = [(DEMO_REPO, 4, "hf"), (DEMO_REPO, 8, "lms"), (DENSE_REPO, 4, "lms"),
         (DENSE_REPO, 8, "hf"), (MOE_REPO, 4, "hf"), (MOE_REPO, 8, "lms")]


@pytest.mark.parametrize("repo,bits,kind", CASES, ids=[f"{SHORT[r]}-{b}bit-{k}"
                                                       for r, b, k in CASES])
def test_graft_fetches_only_the_head_and_speculates_exactly(env, repo, bits, kind,
                                                            engine_convert_acceptance):
    folder, owner = place(env, repo, bits, kind)
    before = tree_hashes(owner)
    env["hub"].reset_counts()
    # Random tiny heads draft at chance (acceptance ~0): the threshold is tested on its own.
    res = graft(folder, store=env["store"], min_acceptance=0.1 if repo == DEMO_REPO else 0.0)
    assert res.status == "grafted" and res.mode == "linked" and res.source == repo
    served = sum(env["hub"].served_for(repo).values())
    assert res.bytes_fetched == res.head_bytes > 0 and res.resumed_bytes == 0
    assert res.head_bytes <= served <= (res.head_bytes + res.metadata_bytes) * 1.05
    assert served < res.repo_bytes / 4  # not the whole repo
    assert tree_hashes(owner) == before  # the other app's folder is byte-identical
    m = engine.load(res.path)
    assert m.mtp is not None and m.info.has_mtp
    assert m.mtp.fc.bits == 8  # the head is kept at 8 bits, whatever the trunk's
    base = greedy(m, 0)
    for depth in (1, 2, 3):
        assert greedy(m, depth) == base, depth
    if repo == DEMO_REPO:
        own = engine_convert_acceptance(bits)
        assert res.acceptance >= 0.95 * own, (res.acceptance, own)


def test_graft_beside_a_model_the_store_owns(env):
    from engine.hub.local_models import import_model

    folder, _ = place(env, DENSE_REPO, 8, "lms")
    dest, _, _ = import_model(folder, store=env["store"], name="dense-8", link=False)
    res = graft("dense-8", store=env["store"], min_acceptance=0.0, bits=16)
    assert res.mode == "sidecar" and res.path == str(dest) and res.bits == 16
    row = env["store"].get("dense-8")
    assert row.status == "installed" and row.has_mtp, row
    m = engine.load(dest)
    assert m.mtp is not None and not hasattr(m.mtp.fc, "bits")  # 16: the source's bytes
    assert greedy(m, 3) == greedy(m, 0)
    with pytest.raises(GraftError, match="already has an MTP head"):
        graft("dense-8", store=env["store"])


def test_a_head_that_does_not_fit_is_refused_and_nothing_changes(env):
    folder, owner = place(env, DENSE_REPO, 4, "lms")
    before = tree_hashes(owner)
    with pytest.raises(GraftError, match=r"does not fit this model \(acceptance 0\.0"):
        graft(folder, store=env["store"])
    assert tree_hashes(owner) == before
    assert not env["store"].path_for("mlx-community--tiny-dense-4bit-mtp").exists()
    assert not any(r.has_mtp for r in env["store"].list(include_builtin=False))


def test_wrong_sources_are_refused_before_any_head_byte(env):
    demo, _ = place(env, DEMO_REPO, 4, "lms")
    spans = head_ranges(env, DENSE_REPO)
    with pytest.raises(GraftError, match=r"not tiny/dense-src's \(hidden_size is 192 here, 64"):
        graft(demo, source=DENSE_REPO, store=env["store"])
    assert fetched_head_bytes(env, DENSE_REPO, spans) == 0
    dense, _ = place(env, DENSE_REPO, 4, "hf")
    spans = head_ranges(env, OTHER_REPO)
    with pytest.raises(GraftError, match=r"not tiny/dense-other's \(.*differs"):
        graft(dense, source=OTHER_REPO, store=env["store"])
    assert fetched_head_bytes(env, OTHER_REPO, spans) == 0
    assert sum(env["hub"].served_for(OTHER_REPO).values()) < 20_000  # headers + a few norms


def _start_cli(env, folder) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "engine", "graft", str(folder), "--models-dir",
           str(env["store"].root), "--json"]
    e = subprocess_env(env["hub"], env["tmp"] / "home", HF_HUB_CACHE=os.environ["HF_HUB_CACHE"],
                       LMSTUDIO_MODELS_DIR=os.environ["LMSTUDIO_MODELS_DIR"],
                       MTPLX_MODEL_DIR=os.environ["MTPLX_MODEL_DIR"], PYTHONPATH=os.getcwd())
    return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


def _wait_for_part(parts, more_than: int) -> int:
    deadline = time.monotonic() + 60
    got = 0
    while time.monotonic() < deadline:
        got = sum(p.stat().st_size for p in parts.glob("*.part")) if parts.is_dir() else 0
        if got > more_than:
            break
        time.sleep(0.05)
    return got


def test_sigkill_mid_graft_then_rerun_resumes_without_refetching(env):
    folder, _ = place(env, DEMO_REPO, 4, "lms")
    hubs = env["hub"]
    hubs.chunk_size, hubs.chunk_delay_s = 16 * 1024, 0.03
    parts = env["store"].root / ".graft" / "mlx-community--mtp-demo-4bit-mtp" / "spans"
    proc = _start_cli(env, folder)
    got = _wait_for_part(parts, 500_000)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert got > 500_000, "the graft never started fetching"
    hubs.chunk_delay_s = 0.0
    hubs.wait_idle()
    hubs.reset_counts()
    res = graft(folder, store=env["store"])
    assert res.status == "grafted" and res.resumed_bytes >= 500_000
    assert res.bytes_fetched + res.resumed_bytes == res.head_bytes
    served = sum(hubs.served_for(DEMO_REPO).values())
    assert served <= res.head_bytes - res.resumed_bytes + res.metadata_bytes + res.check_bytes
    assert not parts.exists()  # the work folder is gone after success


@pytest.mark.slow
def test_ctrl_c_cancels_keeps_the_part_and_exits_130(env):
    folder, _ = place(env, DEMO_REPO, 4, "lms")
    env["hub"].chunk_size, env["hub"].chunk_delay_s = 16 * 1024, 0.03
    parts = env["store"].root / ".graft" / "mlx-community--mtp-demo-4bit-mtp" / "spans"
    proc = _start_cli(env, folder)
    assert _wait_for_part(parts, 200_000) > 200_000, "the graft never started fetching"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and '"status": "cancelled"' in out
    assert _wait_for_part(parts, 0) > 200_000  # kept for the next run
    env["hub"].chunk_delay_s = 0.0


def _head_in_its_own_shard(tmp_path) -> dict[str, bytes]:
    """The demo's repo with its head in a shard of its own (as some repos ship it)."""
    import json

    import mlx.core as mx

    src = engine.default_model_path()
    w = mx.load(str(src / "model.safetensors"))
    files = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()
             and p.name != "model.safetensors"}
    parts = {"model-00001-of-00002.safetensors": {k: v for k, v in w.items()
                                                  if not k.startswith("mtp.")},
             "model-00002-of-00002.safetensors": {k: v for k, v in w.items()
                                                  if k.startswith("mtp.")}}
    index = {"metadata": {}, "weight_map": {}}
    for name, part in parts.items():
        mx.save_safetensors(str(tmp_path / name), part, metadata={"format": "pt"})
        files[name] = (tmp_path / name).read_bytes()
        index["weight_map"].update({k: name for k in part})
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    return files


def test_a_whole_head_shard_is_checked_against_the_hubs_sha256(env, tmp_path):
    folder, _ = place(env, DEMO_REPO, 4, "lms")
    files = _head_in_its_own_shard(tmp_path)
    env["hub"].repos["split/demo"] = FakeRepo(files)
    env["hub"].repos["split/bad"] = FakeRepo(files, corrupt={
        "model-00002-of-00002.safetensors": {"sha256": "0" * 64}})
    with pytest.raises(hub.IntegrityError, match="does not match the sha256"):
        graft(folder, source="split/bad", store=env["store"])
    res = graft(folder, source="split/demo", store=env["store"])
    assert res.status == "grafted" and res.acceptance > 0.7
    assert sum(env["hub"].served_for("split/demo").values()) < res.head_bytes * 1.05


def _cli(args, capsys) -> tuple[int, list[str]]:
    from engine.cli import main

    rc = main(["graft", *args])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    return rc, err


def test_offline_gated_and_missing_revision_end_in_one_line(env, monkeypatch, capsys):
    from huggingface_hub import constants

    folder, _ = place(env, DENSE_REPO, 4, "lms")
    rc, err = _cli([str(folder), "--from", "tiny/gated-src", "--models-dir",
                    str(env["store"].root)], capsys)
    assert rc == 2 and len(err) == 1 and "gated" in err[0] and "HF_TOKEN" in err[0]
    rc, err = _cli([str(folder), "--revision", "v9", "--models-dir", str(env["store"].root)],
                   capsys)
    assert rc == 2 and len(err) == 1 and "no revision 'v9'" in err[0]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    rc, err = _cli([str(folder), "--models-dir", str(env["store"].root)], capsys)
    assert rc == 2 and len(err) == 1 and "HF_HUB_OFFLINE" in err[0]
    with pytest.raises(hub.HubOfflineError):
        graft(folder, store=env["store"])


def test_verdicts_offer_the_head_with_its_real_size(env, capsys):
    from engine.cli import main
    from engine.hub.inspection import inspect_local, inspect_repo
    from engine.hub.search import HubSearch, check_all

    folder, _ = place(env, DEMO_REPO, 4, "lms")
    src = read_source(DEMO_REPO)
    line = f"MTP head available from {DEMO_REPO}: {src.head_bytes / 1e6:.1f} MB"
    r = inspect_repo("mlx-community/mtp-demo-4bit")
    assert r["supported"] and not r["has_mtp"] and r["mtp_head"]["bytes"] == src.head_bytes
    assert any(line in why for why in r["reasons"]) and "engine graft" in r["fix"]
    assert "convert" not in r["fix"]
    r = inspect_local(folder, offer="online")
    assert any(line in why for why in r["reasons"]) and "engine graft" in r["fix"]
    results = check_all(HubSearch("mtp-demo-4bit").next_page())
    assert [x.note for x in results] == [line]
    assert main(["list", "--models-dir", str(env["store"].root)]) == 0
    out = capsys.readouterr().out
    assert f"+ {line}: python -m engine graft mlx-community/mtp-demo-4bit" in out
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert line in out and "fix: add the MTP head, downloading only it" in out


def test_catalog_lists_grafts_with_the_heads_real_size_once_read(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from engine.hub.catalog import catalog_for_machine, head_bytes_estimate
    from engine.hub.graft_source import remember_offer

    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))

    def nine_b():
        cat = catalog_for_machine(store_root=tmp_path, total_mem=64 * 2**30,
                                  free_fn=lambda p: 10**12)
        return next(m for m in cat["models"] if m["repo_id"] == "Qwen/Qwen3.5-9B")

    g = {o["quantization"]: o for o in nine_b()["graft"]}["4bit"]
    assert g["head_bytes"] == head_bytes_estimate("Qwen/Qwen3.5-9B") and \
        not g["head_bytes_measured"]
    assert g["conversion_repo"] == "mlx-community/Qwen3.5-9B-4bit"
    assert g["download_bytes"] < 0.4 * nine_b()["quantizations"]["bf16"]["download_bytes"]
    remember_offer(SimpleNamespace(repo_id="Qwen/Qwen3.5-9B", commit="c" * 40,
                                   head_bytes=321_000_000, repo_bytes=19 * 10**9))
    g = {o["quantization"]: o for o in nine_b()["graft"]}["4bit"]
    assert g["head_bytes"] == 321_000_000 and g["head_bytes_measured"]
    spec = nine_b()["quantizations"]["4bit"]
    assert g["download_bytes"] == spec["converted_bytes"] + 321_000_000


def test_a_trunk_with_other_embeddings_but_the_same_norms_is_refused(env, tmp_path):
    """Norms alone do not prove it: the quantized embedding's rows, dequantized, must agree
    with the source's within the quantization's error."""
    import mlx.core as mx

    folder, _ = place(env, DEMO_REPO, 4, "lms")
    src = engine.default_model_path()
    w = mx.load(str(src / "model.safetensors"))
    name = "model.language_model.embed_tokens.weight"
    w[name] = w[name] + mx.where(mx.arange(w[name].shape[0])[:, None] == 1, 0.5, 0.0)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), w, metadata={"format": "pt"})
    files = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    files["model.safetensors"] = (tmp_path / "model.safetensors").read_bytes()
    env["hub"].repos["other/demo-finetune"] = FakeRepo(files)
    spans = head_ranges(env, "other/demo-finetune")
    with pytest.raises(GraftError, match=r"row 1 of embed_tokens differs beyond the "
                                         r"quantization's error"):
        graft(folder, source="other/demo-finetune", store=env["store"])
    assert fetched_head_bytes(env, "other/demo-finetune", spans) == 0
