"""A simulated MTP workload for the dashboard (``python -m app.dashboard --demo`` shows it).

The simulation alternates in-domain replies (high acceptance) and out-of-domain ones (low),
chooses depths with the real ``AdaptiveDepth`` controller, and times cycles with a cost model
(a verify forward that grows with depth, a cheap draft). Its tuner table comes from running the
real ``engine.depth.tuner.tune`` on the same simulated model. Time is virtual: ``--history`` seconds
are replayed instantly, then the stream continues in real time. Nothing here touches MLX.
"""
from __future__ import annotations

import random

from PySide6.QtCore import QObject, Signal

from engine.depth.controller import AdaptiveDepth
from engine.metrics.stats import MemorySample, read_memory
from engine.metrics.summary import ReplyTally
from engine.types import CycleStats, Event, ModelInfo, PrefillStats

IN_DOMAIN = (0.92, 0.84, 0.74)  # conditional acceptance by position
OUT_OF_DOMAIN = (0.42, 0.3, 0.22)
DEMO_INFO = ModelInfo(
    path="(simulated)", name="Qwen3.5-4B (simulated)", architecture="Qwen3_5ForConditionalGeneration",
    family="qwen3_5", layout="mlx", num_parameters=4_000_000_000, bytes_on_disk=2_600_000_000,
    quantization={"bits": 4}, has_mtp=True, mtp_layers=1, max_depth=3, context_length=32768,
    vocab_size=151936, hidden_size=2560, num_layers=32, dtype="bfloat16")


def cycle_times(rng: random.Random, depth: int) -> tuple[float, float, float, float, float]:
    """(draft, verify, accept, commit, other) seconds for one simulated cycle."""
    jitter = 1 + 0.06 * (2 * rng.random() - 1)
    return (0.0011 * depth * jitter, (0.0165 + 0.0024 * depth) * jitter,
            0.0004 + 0.0001 * depth, 0.0006 + 0.0002 * depth, 0.0003)


def simulated_cycle(rng, index: int, depth: int, profile, reason: str, ctx: int) -> CycleStats:
    accepted = 0
    while accepted < depth and rng.random() < profile[accepted]:
        accepted += 1
    td, tv, ta, tc, to = cycle_times(rng, depth)
    emitted = tuple(rng.randrange(1000) for _ in range(accepted + 1))
    kind = "plain" if depth == 0 else "bonus" if accepted == depth else "correction"
    return CycleStats(index=index, depth=depth, drafted=emitted[:accepted] + (0,) * (depth - accepted),
                      accepted=accepted, emitted=emitted,
                      from_draft=(True,) * accepted + (False,), extra_kind=kind, t_draft=td,
                      t_verify=tv, t_accept=ta, t_commit=tc, t_total=td + tv + ta + tc + to,
                      context_tokens=ctx + len(emitted), host_syncs=4, depth_reason=reason)


class DemoFeed(QObject):
    """Emits ``stats(request_id, obj)`` and ``finished(request_id, reason, ReplySummary)`` like
    the app's worker, on a virtual clock (``clock()``)."""

    stats = Signal(int, object)
    finished = Signal(int, str, object)

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.controller = AdaptiveDepth(3, seed=seed)
        self.request = 0
        self.remaining = 0
        self.index = 0
        self.ctx = 0
        self.idle_until = 0.0
        self.profile = IN_DOMAIN
        self.tally = ReplyTally()

    def clock(self) -> float:
        return self.now

    def advance(self, until: float) -> None:
        while self.now < until:
            if self.remaining <= 0:
                if self.now < self.idle_until:
                    self.now = min(until, self.idle_until)
                    continue
                self._start_reply()
                continue
            d, reason = self.controller.choose()
            c = simulated_cycle(self.rng, self.index, d, self.profile, reason, self.ctx)
            self.controller.observe(c)
            self.index += 1
            self.ctx = c.context_tokens
            self.remaining -= len(c.emitted)
            self.now += c.t_total
            self.tally.add(Event(token_ids=c.emitted, stats=c))
            self.stats.emit(self.request, c)
            if self.remaining <= 0:
                self.tally.add(Event(token_ids=(), finish_reason="stop"))
                self.finished.emit(self.request, "stop", self.tally.summary())
                self.idle_until = self.now + self.rng.uniform(1.5, 4.0)

    def _start_reply(self) -> None:
        self.request += 1
        self.profile = IN_DOMAIN if self.request % 3 else OUT_OF_DOMAIN
        self.controller.new_request()
        prompt = self.ctx + self.rng.randrange(40, 400)
        reused = self.ctx
        seconds = (prompt - reused) / 1900 + 0.03
        self.now += seconds
        self.ctx, self.index = prompt, 0
        self.remaining = self.rng.randrange(180, 520)
        prefill = PrefillStats(prompt, reused, seconds)
        self.tally = ReplyTally()
        self.tally.add(Event(token_ids=(self.rng.randrange(1000),), prefill=prefill))
        self.stats.emit(self.request, prefill)


class SimulatedModel:
    """Enough of ``engine.Model`` for ``engine.depth.tuner.tune``: a virtual clock and cycles."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.info = DEMO_INFO
        self.t = 0.0

    def chat_ids(self, messages):
        return [1] * (8 + len(messages[0]["content"]) // 4)

    def generate(self, prompt_ids, *, max_tokens, depth, sampling, seed, cancel):
        profile = IN_DOMAIN if len(prompt_ids) % 4 else OUT_OF_DOMAIN
        self.t += 0.05
        yield Event(token_ids=(1,), prefill=PrefillStats(len(prompt_ids), 0, 0.05))
        left = max_tokens - 1
        while left > 0:
            c = simulated_cycle(self.rng, 0, depth, profile, "fixed", 0)
            self.t += c.t_total
            left -= len(c.emitted)
            yield Event(token_ids=c.emitted, stats=c, finish_reason="length" if left <= 0 else None)


def demo_tune_result():
    from engine.depth.tuner import tune

    model = SimulatedModel()
    return tune(model, depths=(1, 2, 3), repeats=3, max_tokens=96, save=False,
                clock=lambda: model.t)


def demo_memory(clock) -> MemorySample:
    rss = read_memory().rss_bytes
    return MemorySample(int(2.62e9 + 4e7 * (clock() % 7) / 7), int(2.91e9), rss, clock())
