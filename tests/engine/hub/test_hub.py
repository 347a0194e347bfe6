"""Downloads against the fake Hub: resume, retries, cancel, errors, integrity, disk preflight."""
from __future__ import annotations

import hashlib
import socket
import threading

import pytest

from engine.hub import client as hub
from engine.hub.download import Downloader
from engine.hub.store import Store
from tests.fakehub import VALID_TOKEN, FakeHub, point_hf_at, tiny_repos

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "models")


def _dl(repo, store, **kw) -> Downloader:
    kw.setdefault("tick_s", 0.05)
    kw.setdefault("retry_backoff_s", 0.01)
    return Downloader(repo, store=store, **kw)


def _sizes(repos, repo_id):
    return {p: len(b) for p, b in repos[repo_id].files.items()}


def test_full_download_installs_identical_verified_files(fake, repos, store):
    events = []
    res = _dl("tiny/mtp", store, progress=events.append).run()
    assert res.status == "installed" and res.bytes_fetched == res.bytes_total
    installed = store.path_for(res.name)
    for path, data in repos["tiny/mtp"].files.items():
        assert (installed / path).read_bytes() == data
    assert fake.served_for("tiny/mtp") == _sizes(repos, "tiny/mtp")  # each byte served once
    row = store.get(res.name)
    assert (row.status, row.has_mtp, row.family, row.repo_id) == ("installed", True, "qwen3_5",
                                                                  "tiny/mtp")
    assert not store.staging_path(res.name).exists()
    assert events[-1].phase == "done" and events[-1].bytes_done == events[-1].bytes_total
    phases = [e.phase for e in events]
    assert phases.index("downloading") < phases.index("verifying") < phases.index("installing")


def test_dropped_connection_resumes_from_the_byte_reached(fake, repos, store):
    fake.drop_after(SHARD1, 100_000)
    fake.drop_after(SHARD2, 50_000, times=2)
    events = []
    res = _dl("tiny/mtp", store, progress=events.append).run()
    assert res.status == "installed"
    served = fake.served_for("tiny/mtp")
    assert served == _sizes(repos, "tiny/mtp")  # nothing fetched twice
    ranges = [r["range"] for r in fake.requests if r["path"].endswith(SHARD1)]
    assert ranges == [None, "bytes=100000-"]
    ranges2 = [r["range"] for r in fake.requests if r["path"].endswith(SHARD2)]
    assert ranges2 == [None, "bytes=50000-", "bytes=100000-"]
    assert max(e.retries for e in events) == 3


def test_server_errors_are_retried(fake, store):
    fake.fail_with(503, times=2, path=SHARD2)
    res = _dl("tiny/mtp", store).run()
    assert res.status == "installed"
    assert sum(1 for r in fake.requests if r["path"].endswith(SHARD2)) == 3


def test_persistent_server_errors_give_up_and_keep_finished_files(fake, store):
    fake.fail_with(500, times=50, path=SHARD2)
    with pytest.raises(hub.HubNetworkError, match="giving up"):
        _dl("tiny/mtp", store, max_retries=2).run()
    staging = store.staging_path("tiny--mtp")
    assert (staging / SHARD1).is_file()
    assert store.get("tiny--mtp").status == "incomplete"


def test_redirect_to_cdn_does_not_leak_the_token(fake, repos, store):
    fake.redirect = True
    res = _dl("tiny/mtp", store, token=VALID_TOKEN).run()
    assert res.status == "installed"
    cdn = [r for r in fake.requests if r["host"] == "cdn"]
    assert len(cdn) == len(repos["tiny/mtp"].files)
    assert all(r["auth"] is None for r in cdn)
    assert any(r["auth"] == f"Bearer {VALID_TOKEN}" for r in fake.requests if r["host"] == "hub")


def test_cancel_keeps_the_partial_and_a_rerun_fetches_only_the_rest(fake, repos, store):
    fake.chunk_size = 16 * 1024
    fake.path_delay_s[SHARD1] = 0.01
    cancel = threading.Event()

    def on_progress(p):
        if p.file == SHARD1 and p.file_bytes_done > 200_000:
            cancel.set()

    res = _dl("tiny/mtp", store, progress=on_progress, cancel=cancel).run()
    assert res.status == "cancelled"
    part = store.staging_path("tiny--mtp") / (SHARD1 + ".part")
    kept = part.stat().st_size
    assert 200_000 < kept < len(repos["tiny/mtp"].files[SHARD1])
    row = store.get("tiny--mtp")
    assert row.status == "incomplete" and row.bytes_total == sum(_sizes(repos, "tiny/mtp").values())

    fake.path_delay_s.clear()
    fake.wait_idle()  # the server may still be writing to the cancelled connection
    fake.reset_counts()
    res2 = _dl("tiny/mtp", store).run()
    assert res2.status == "installed" and res2.resumed_bytes >= kept
    served = fake.served_for("tiny/mtp")
    assert served.get(SHARD1) == len(repos["tiny/mtp"].files[SHARD1]) - kept
    assert served.get("config.json", 0) == 0  # finished files are not fetched again
    data = (store.path_for("tiny--mtp") / SHARD1).read_bytes()
    assert hashlib.sha256(data).digest() == hashlib.sha256(repos["tiny/mtp"].files[SHARD1]).digest()


def test_stalled_is_reported_and_the_download_still_finishes(fake, store):
    fake.chunk_size = 150_000
    fake.path_delay_s[SHARD2] = 0.6
    events = []
    res = _dl("tiny/mtp", store, progress=events.append, stall_after_s=0.25).run()
    assert res.status == "installed"
    stalled = [e for e in events if e.stalled]
    assert stalled and all(e.file == SHARD2 for e in stalled)
    assert max(e.stalled_for_s for e in stalled) >= 0.25
    assert not events[-1].stalled


def test_gated_repo_explains_how_to_add_a_token(fake, store, monkeypatch):
    with pytest.raises(hub.GatedRepoError) as err:
        _dl("tiny/gated", store).run()
    msg = str(err.value)
    assert "hf auth login" in msg and "HF_TOKEN" in msg
    assert store.get("tiny--gated").status == "incomplete"  # nothing installed
    monkeypatch.setenv("HF_TOKEN", VALID_TOKEN)
    assert _dl("tiny/gated", store).run().status == "installed"


def test_saved_token_is_used(fake, store):
    hub.save_token(VALID_TOKEN)
    assert hub.resolve_token() == VALID_TOKEN
    assert _dl("tiny/gated", store).run().status == "installed"
    hub.save_token(None)
    assert hub.resolve_token() is None


def test_missing_repo_revision_and_no_network(fake, store, monkeypatch):
    with pytest.raises(hub.RepoNotFoundError, match="nope/nothing"):
        _dl("nope/nothing", store).run()
    with pytest.raises(hub.RevisionNotFoundError, match="v9"):
        _dl("tiny/mtp", store, revision="v9").run()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", dead)
    with pytest.raises(hub.HubNetworkError, match="cannot reach"):
        _dl("tiny/mtp", store).run()


def test_offline_mode_is_a_clear_error(fake, store, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.HubOfflineError, match="HF_HUB_OFFLINE"):
        _dl("tiny/mtp", store).run()


def test_corrupt_file_is_detected_and_not_installed(fake, repos, store):
    files = repos["tiny/corrupt"].files
    with pytest.raises(hub.IntegrityError, match=SHARD2):
        _dl("tiny/corrupt", store).run()
    assert not store.path_for("tiny--corrupt").exists()
    assert not (store.staging_path("tiny--corrupt") / SHARD2).exists()
    assert fake.served_for("tiny/corrupt")[SHARD2] == 2 * len(files[SHARD2])  # one retry


def test_disk_space_preflight_refuses_before_downloading(fake, store):
    with pytest.raises(hub.NotEnoughDiskError, match="not enough disk space"):
        _dl("tiny/mtp", store, free_space=lambda path: 10_000).run()
    assert fake.served_for("tiny/mtp") == {}


def test_files_changed_upstream_are_refetched(fake, repos, store):
    fake.chunk_size = 16 * 1024
    fake.path_delay_s[SHARD2] = 0.01
    cancel = threading.Event()
    res = _dl("tiny/mtp", store, cancel=cancel,
              progress=lambda p: p.file == SHARD2 and p.file_bytes_done > 0 and cancel.set()).run()
    assert res.status == "cancelled"
    assert (store.staging_path("tiny--mtp") / SHARD1).is_file()
    repo = repos["tiny/mtp"]
    old = repo.files[SHARD1]
    repo.files[SHARD1] = old[:-8] + b"\x00" * 8  # a new commit changes the shard
    fake.path_delay_s.clear()
    try:
        fake.wait_idle()
        fake.reset_counts()
        assert _dl("tiny/mtp", store).run().status == "installed"
        assert fake.served_for("tiny/mtp")[SHARD1] == len(old)
        assert (store.path_for("tiny--mtp") / SHARD1).read_bytes() == repo.files[SHARD1]
    finally:
        repo.files[SHARD1] = old


def test_parse_repo_ref():
    assert hub.parse_repo_ref("Qwen/Qwen3.5-4B") == ("Qwen/Qwen3.5-4B", None)
    assert hub.parse_repo_ref("https://huggingface.co/Qwen/Qwen3.5-4B/tree/dev") == \
        ("Qwen/Qwen3.5-4B", "dev")
    assert hub.parse_repo_ref("hf.co/mlx-community/Qwen3.5-4B-4bit/") == \
        ("mlx-community/Qwen3.5-4B-4bit", None)
    for bad in ("", "justaname", "a/b/c/d e", "../x"):
        with pytest.raises(hub.RepoNotFoundError):
            hub.parse_repo_ref(bad)


def test_read_timeouts_are_retried_from_the_byte_reached(fake, repos, store):
    fake.chunk_size = 150_000
    fake.path_delay_s[SHARD2] = 1.0  # silent for longer than the read timeout after each chunk
    events = []
    res = _dl("tiny/mtp", store, read_timeout_s=0.3, progress=events.append).run()
    assert res.status == "installed"
    ranges = [r["range"] for r in fake.requests if r["path"].endswith(SHARD2)]
    assert ranges[0] is None and ranges[1:] == ["bytes=150000-", "bytes=300000-"]
    assert any("timed out" in e.message for e in events)


def test_cancel_interrupts_a_silent_server_at_once(fake, store):
    import time

    fake.chunk_size = 16 * 1024
    fake.path_delay_s[SHARD1] = 30.0
    cancel = threading.Event()
    t0 = []

    def on_progress(p):
        if p.file == SHARD1 and p.file_bytes_done > 0 and not cancel.is_set():
            t0.append(time.monotonic())
            cancel.set()

    res = _dl("tiny/mtp", store, cancel=cancel, progress=on_progress).run()
    assert res.status == "cancelled"
    assert time.monotonic() - t0[0] < 2.0  # not the 30 s the server sits silent


def test_disk_full_while_writing_keeps_the_part_and_says_so(fake, repos, store, monkeypatch):
    import builtins
    import errno

    import engine.hub.download as dl

    class _FullDisk:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            if self.fh.tell() + len(data) > 200_000:
                self.fh.write(data[:100])  # a short write before the error
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.fh.write(data)

        def __getattr__(self, name):
            return getattr(self.fh, name)

    def fake_open(path, mode="r", *a, **k):
        fh = builtins.open(path, mode, *a, **k)
        return _FullDisk(fh) if str(path).endswith(SHARD1 + ".part") and "a" in mode else fh

    monkeypatch.setattr(dl, "open", fake_open, raising=False)
    with pytest.raises(hub.NotEnoughDiskError, match="disk filled up"):
        _dl("tiny/mtp", store).run()
    part = store.staging_path("tiny--mtp") / (SHARD1 + ".part")
    kept = part.stat().st_size
    assert 0 < kept <= 200_000
    assert part.read_bytes() == repos["tiny/mtp"].files[SHARD1][:kept]  # no torn chunk
    monkeypatch.undo()
    point_hf_at(fake, monkeypatch, store.root.parent)
    fake.wait_idle()
    fake.reset_counts()
    assert _dl("tiny/mtp", store).run().status == "installed"
    assert fake.served_for("tiny/mtp")[SHARD1] == len(repos["tiny/mtp"].files[SHARD1]) - kept
