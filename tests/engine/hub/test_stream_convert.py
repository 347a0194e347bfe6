"""Shard-by-shard convert-on-pull: same tensors as ``convert``, bounded peak disk, resume."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine.hub.store import Store
from engine.paths import folder_size
from tests.fakehub import FakeHub, FakeRepo, _read_dir, point_hf_at
from tests.tinymodels import build_tiny_model


def _tensors(folder) -> dict:
    import mlx.core as mx

    out = {}
    for p in sorted(folder.glob("*.safetensors")):
        out.update(mx.load(str(p)))
    return out


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A tiny model with four real shards of about 0.9 MB each."""
    return build_tiny_model(tmp_path_factory.mktemp("big") / "m", seed=5, shards=4, hidden=128,
                            layers=8)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("moe") / "m", seed=6, shards=3, moe=True)


@pytest.fixture
def hub(big, moe, monkeypatch, tmp_path):
    with FakeHub({"org/big": FakeRepo(_read_dir(big)), "org/moe": FakeRepo(_read_dir(moe))}) as h:
        point_hf_at(h, monkeypatch, tmp_path)
        yield h


class Sampler:
    """Samples the store's size every millisecond (an independent check of the peak)."""

    def __init__(self, root):
        self.root, self.peak, self._stop = root, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, folder_size(self.root))
            time.sleep(0.001)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, folder_size(self.root))  # the state it ended in


@pytest.mark.parametrize("repo", ["org/big", "org/moe"])
def test_streamed_output_equals_convert(hub, repo, big, moe, tmp_path):
    from engine.hub.pull import pull
    from engine.models.convert import convert

    src = big if repo == "org/big" else moe
    ref = _tensors(convert(src, tmp_path / "ref", bits=4, group_size=32))
    res = pull(repo, convert_bits=4, group_size=32, store=Store(tmp_path / "s"))
    got = _tensors(tmp_path / "s" / res.name)
    assert res.converted and sorted(got) == sorted(ref)
    for k in ref:
        assert np.array_equal(np.array(got[k]), np.array(ref[k])), k


def test_peak_disk_is_converted_plus_one_shard(hub, big, tmp_path):
    import engine
    from engine.hub.pull import pull
    from engine.models.convert import convert

    hub.chunk_size, hub.chunk_delay_s = 16384, 0.0005
    shards = {p: len(b) for p, b in hub.repos["org/big"].files.items()
              if p.endswith(".safetensors")}
    s1 = Store(tmp_path / "stream")
    with Sampler(s1.root) as sampled:
        res = pull("org/big", convert_bits=4, group_size=32, store=s1)
    converted = folder_size(tmp_path / "stream" / res.name)
    bound = (converted + max(shards.values())) * 1.10
    engine_peak = int(res.notes[0].split()[2])
    assert sampled.peak <= bound and engine_peak <= bound, (sampled.peak, engine_peak, bound)
    # Against a plain pull then convert (raw and converted on disk together):
    s2 = Store(tmp_path / "plain")
    with Sampler(s2.root) as plain:
        raw = pull("org/big", store=s2)
        convert(raw.path, s2.root / "converted", bits=4, group_size=32)
    assert plain.peak > sum(shards.values()) + converted * 0.9
    print(f"\nPEAK DISK streamed {sampled.peak} (engine probe {engine_peak}), "
          f"plain pull + convert {plain.peak}, converted {converted}, "
          f"raw {sum(shards.values())}, largest raw shard {max(shards.values())}")
    m = engine.load(res.path)
    assert m.mtp is not None and m.info.quantization["bits"] == 4


def test_cancel_then_resume_skips_finished_shards(hub, tmp_path):
    from engine.hub.pull import pull

    store = Store(tmp_path / "s")
    cancel = threading.Event()
    state = store.staging_path("org--big-mlx-4bit") / ".mtpchat" / "stream_convert.json"

    def progress(p):
        if state.exists() and '"model-00002' in state.read_text():
            cancel.set()

    hub.chunk_size, hub.chunk_delay_s = 16384, 0.002
    first = pull("org/big", convert_bits=4, group_size=32, store=store, progress=progress,
                 cancel=cancel, tick_s=0.01)
    assert first.status == "cancelled"
    hub.chunk_delay_s = 0
    hub.reset_counts()
    res = pull("org/big", convert_bits=4, group_size=32, store=store)
    served = hub.served_for("org/big")
    assert res.status == "installed"
    assert "model-00001-of-00004.safetensors" not in served
    assert "model-00002-of-00004.safetensors" not in served
    assert served.get("model-00004-of-00004.safetensors")
