"""The memory budget through a real ``engine serve`` process (``--memory-budget +SIZE``): a request
whose prompt alone would pass the budget gets a 400 naming it, and eight concurrent long
requests all complete while the process's resident memory, sampled every 10 ms, stays under
the budget (the ones that do not fit beside the others wait in the queue)."""
from __future__ import annotations

import threading
import time

import httpx
import psutil
import pytest

from tests.server.conftest import start_serve

pytestmark = pytest.mark.timeout(300)

HEADROOM_MB = 100


def _prompt(i: int, words: int) -> str:
    return f"Note {i}: " + " ".join(f"item{(i * 7 + j) % 97} is ready." for j in range(words))


def test_budget_refuses_queues_and_holds(tmp_path):
    server = start_serve(tmp_path, "--memory-budget", f"+{HEADROOM_MB}MB", "--max-streams", "8")
    proc = psutil.Process(server.proc.pid)
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.01)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        mem = httpx.get(server.url + "/health", timeout=30).json()["memory"]
        budget = mem["budget_bytes"]
        assert budget == mem["base_bytes"] + HEADROOM_MB * 2**20

        big = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "prompt": _prompt(0, 500), "max_tokens": 8, "temperature": 0})
        assert big.status_code == 400, big.text
        assert "memory budget" in big.json()["error"]["message"]

        results: list = [None] * 8

        def one(i: int) -> None:
            results[i] = httpx.post(server.url + "/v1/completions", timeout=240, json={
                "prompt": _prompt(i + 1, 60), "max_tokens": 32, "temperature": 0})
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r is not None and r.status_code == 200 for r in results), \
            [r.text[:200] for r in results if r is not None and r.status_code != 200]
        # every request ran to its end (a raw prompt this far from the demo's corpus may be
        # answered by an end token at once: the text can be empty, the reply is not cut)
        assert all(r.json()["choices"][0]["finish_reason"] in ("stop", "length")
                   for r in results)
        assert all(r.json()["usage"]["prompt_tokens"] > 60 for r in results)
        time.sleep(0.05)
        print(f"peak RSS {peak[0] / 2**20:.0f} MB, budget {budget / 2**20:.0f} MB "
              f"(base {mem['base_bytes'] / 2**20:.0f} MB)")
        assert peak[0] <= budget
    finally:
        stop.set()
        server.stop()
        server.close()
