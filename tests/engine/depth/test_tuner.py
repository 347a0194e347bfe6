"""The depth tuner against a scripted fake model: known costs, known acceptance."""
from __future__ import annotations

import itertools
import json
import threading

import pytest

from engine.core.carryover import carryover_of
from engine.depth.tuner import PROMPTS, TuneRow, pick_winner, tune
from engine.errors import GenerationError
from engine.hub import store
from engine.types import CycleStats, Event, ModelInfo, PrefillStats

# How many drafts the "target" would accept, cycle after cycle (scripted, not random).
REACH = (3, 3, 1, 3, 0, 3, 4, 2)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ScriptedModel:
    """Each cycle at depth d costs c0 + c1*d seconds of fake clock and accepts
    min(d, next reach) drafts; ``slow`` = {(seed, depth): factor} makes some runs slower."""

    def __init__(self, path, *, c0=0.02, c1=0.004, reach=REACH, slow=None, has_mtp=True):
        self.clock = FakeClock()
        self.c0, self.c1, self.reach = c0, c1, reach
        self.slow = slow or {}
        self.calls: list[tuple[int, int]] = []
        self.info = ModelInfo(
            path=str(path), name="scripted", architecture="Qwen3_5ForConditionalGeneration",
            family="qwen3_5", layout="hf", num_parameters=1, bytes_on_disk=1, quantization=None,
            has_mtp=has_mtp, mtp_layers=1, max_depth=4, context_length=4096, vocab_size=100,
            hidden_size=8, num_layers=2, dtype="float32")

    def chat_ids(self, messages):
        return [1, 2, 3] + [ord(c) % 100 for c in messages[0]["content"][:20]]

    def generate(self, prompt_ids, *, max_tokens, depth, sampling, seed, cancel):
        self.calls.append((depth, max_tokens))
        self.clock.t += 0.05  # prefill
        yield Event(token_ids=(5,), prefill=PrefillStats(len(prompt_ids), 0, 0.05))
        reach = itertools.cycle(self.reach)
        left = max_tokens - 1
        index = 0
        while left > 0:
            if cancel is not None and cancel.is_set():
                yield Event(token_ids=(), finish_reason="cancelled")
                return
            a = min(depth, next(reach))
            emitted = tuple(range(a + 1))[:left]
            self.clock.t += (self.c0 + self.c1 * depth) * self.slow.get((seed, depth), 1.0)
            left -= len(emitted)
            kind = "plain" if depth == 0 else ("bonus" if a == depth else "correction")
            stats = CycleStats(index=index, depth=depth, drafted=tuple(range(depth)),
                               accepted=a, emitted=emitted, from_draft=(True,) * a + (False,),
                               extra_kind=kind)
            index += 1
            yield Event(token_ids=emitted, stats=stats,
                        finish_reason="length" if left <= 0 else None)


def expected_rate(depth: int, c0: float, c1: float, reach=REACH) -> float:
    tokens = sum(min(depth, r) + 1 for r in reach) / len(reach)
    return tokens / (c0 + c1 * depth)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPCHAT_HOME", str(tmp_path / "home"))
    return tmp_path


def test_picks_the_fastest_depth_and_saves_it(home):
    rates = {d: expected_rate(d, 0.02, 0.004) for d in range(5)}
    best = max(rates, key=rates.get)
    assert best == 3 and rates[3] > 1.05 * max(rates[2], rates[4])  # the script has a clear winner
    model = ScriptedModel(home / "model")
    result = tune(model, depths=(1, 2, 3, 4), repeats=2, max_tokens=161, clock=model.clock)
    assert result.best_depth == 3 and result.saved
    assert [r.depth for r in result.rows] == [0, 1, 2, 3, 4]
    for row in result.rows:  # measured speeds match the script within end-of-run effects
        assert row.tokens_per_second == pytest.approx(rates[row.depth], rel=0.03)
    row3 = result.row(3)
    assert row3.speedup == pytest.approx(rates[3] / rates[0], rel=0.03)
    # acceptance by position at depth 3: position i accepted when reach >= i
    assert row3.acceptance == pytest.approx(
        tuple(sum(r >= i for r in REACH) / len(REACH) for i in (1, 2, 3)), abs=0.02)
    assert row3.tokens_per_cycle == pytest.approx(
        sum(min(3, r) + 1 for r in REACH) / len(REACH), rel=0.03)
    assert "Depth 3 is fastest" in result.message and "Saved" in result.message
    assert store.read_tuned_depth(model.info.path) == 3
    saved = store.read_tuned(model.info.path)
    assert saved["rows"][3]["depth"] == 3 and saved["adaptive_initial"]["depth"] == 3
    json.dumps(result.to_dict())  # plain data


def test_refuses_to_save_when_plain_decoding_wins(home):
    # drafting is expensive and rarely accepted: depth 0 is fastest
    model = ScriptedModel(home / "model", c1=0.02, reach=(0, 0, 1, 0))
    assert max(range(5), key=lambda d: expected_rate(d, 0.02, 0.02, (0, 0, 1, 0))) == 0
    result = tune(model, depths=(1, 2), repeats=1, max_tokens=40, clock=model.clock)
    assert result.best_depth == 0 and not result.saved
    assert "Nothing beats plain decoding" in result.message
    assert "Nothing was saved" in result.message
    assert store.read_tuned(model.info.path) is None


def test_a_depth_that_barely_beats_plain_decoding_is_not_kept(home):
    # depth 1: (1 + 1/8) tokens at 1.1x the cost, 2% faster, under the 3% margin
    reach = (1,) + (0,) * 7
    assert 1.0 < expected_rate(1, 0.02, 0.002, reach) / expected_rate(0, 0.02, 0.002, reach) < 1.03
    model = ScriptedModel(home / "model", c1=0.002, reach=reach)
    result = tune(model, depths=(1,), repeats=1, max_tokens=81, clock=model.clock)
    assert result.best_depth == 0 and not result.saved


def test_ties_go_to_the_lower_depth():
    rows = [TuneRow(0, 10.0, 1.0, (), (), 1.0, 100, (10.0,), 10),
            TuneRow(1, 15.0, 1.5, (), (), 1.5, 100, (15.0,), 15),
            TuneRow(2, 20.0, 2.0, (), (), 2.0, 100, (20.0,), 20),
            TuneRow(3, 20.1, 2.01, (), (), 2.0, 100, (20.1,), 20)]
    assert pick_winner(rows) == 2
    assert pick_winner(rows[:2]) == 1
    assert pick_winner([rows[0], TuneRow(1, 10.2, 1.02, (), (), 1.0, 1, (10.2,), 1)]) == 0


def test_median_ignores_one_slow_repeat(home):
    # repeat 1 of depth 3 is disturbed (3x slower); the median of three keeps depth 3 on top
    model = ScriptedModel(home / "model", slow={(1, 3): 3.0})
    result = tune(model, depths=(2, 3), repeats=3, max_tokens=81, clock=model.clock, save=False)
    runs = result.row(3).runs
    assert min(runs) < 0.5 * max(runs)
    assert result.best_depth == 3 and not result.saved


def test_progress_reports_every_run_and_cancel_stops(home):
    model = ScriptedModel(home / "model")
    seen = []
    cancel = threading.Event()

    def progress(done, total, message):
        seen.append((done, total, message))
        if done == 5:
            cancel.set()

    result = tune(model, depths=(1, 2), repeats=2, max_tokens=30, progress=progress,
                  cancel=cancel, clock=model.clock)
    assert [d for d, _, _ in seen] == [1, 2, 3, 4, 5]
    assert seen[0][1] == 2 * len(PROMPTS) * 3
    assert "depth" in seen[0][2] and "tok/s" in seen[0][2]
    assert result.cancelled and not result.saved and "cancelled" in result.message
    assert store.read_tuned(model.info.path) is None


def test_runs_rotate_depths_and_warm_up_first(home):
    model = ScriptedModel(home / "model")
    tune(model, depths=(1, 2), prompts=["a", "b", "c"], repeats=1, max_tokens=20,
         clock=model.clock, save=False)
    assert model.calls[:2] == [(0, 8), (2, 8)]  # warm-up: short, plain and deepest
    measured = [d for d, _ in model.calls[2:]]
    assert measured == [0, 1, 2, 1, 2, 0, 2, 0, 1]


def test_rejects_models_without_mtp_and_bad_depths(home):
    with pytest.raises(GenerationError, match="no MTP head"):
        tune(ScriptedModel(home / "m", has_mtp=False))
    with pytest.raises(GenerationError, match="between 1 and 4"):
        tune(ScriptedModel(home / "m"), depths=(0, 2))
    with pytest.raises(GenerationError, match="between 1 and 4"):
        tune(ScriptedModel(home / "m"), depths=(5,))
    model = ScriptedModel(home / "m")  # deeper than the head: dropped, the rest measured
    result = tune(model, depths=(2, 6), prompts=["x"], repeats=1, max_tokens=10,
                  clock=model.clock, save=False)
    assert [r.depth for r in result.rows] == [0, 2]


def test_cli_tune_json_on_a_tiny_model(tiny_dir, home, capsys):
    from engine.cli import main

    rc = main(["tune", "--model", str(tiny_dir), "--depths", "1", "--repeats", "1",
               "--max-tokens", "6", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [r["depth"] for r in out["rows"]] == [0, 1]
    assert out["rows"][0]["tokens_per_second"] > 0
    assert out["prompts"] == len(PROMPTS) and out["message"]
    # a random tiny model's drafts are rejected: saved only if depth 1 really won
    assert out["saved"] == (out["best_depth"] == 1)
    assert (store.read_tuned_depth(str(tiny_dir)) is not None) == out["saved"]


def test_the_cli_and_the_app_tune_the_same_depths():
    """One tuner, one set of depths, one saved result (`engine tune` and the app's button)."""
    import argparse
    import inspect as pyinspect

    from engine.commands import tune as tune_cmd
    from engine.depth import tuner

    p = argparse.ArgumentParser()
    tune_cmd.add_arguments(p)
    assert tune_cmd._depths(p.parse_args([]).depths) == tuner.DEPTHS
    assert pyinspect.signature(tuner.tune).parameters["depths"].default == tuner.DEPTHS
    # (the app's worker passes tuner.DEPTHS: tests/app/test_worker.py checks it)


def test_tune_measures_the_path_the_product_runs(tiny_model, home, monkeypatch):
    """The tuner's replies run through the one decoder the app and the server run
    (``BatchDecoder``, a batch of one): every cycle it times is a ``BatchDecoder`` cycle,
    plain (depth 0) and speculative alike, and a scheduled request takes the same one."""
    from engine.core.scheduler import GenRequest, Scheduler
    from engine.decoding import decoder, plain, speculative
    from engine.depth.tuner import tune

    seen = {"plain": 0, "speculative": 0, "decoders": 0}
    real_plain, real_spec, real_init = plain.PlainPipeline.cycle, speculative.run, \
        decoder.BatchDecoder.__init__

    def count(name, fn):
        def wrapped(*a, **k):
            seen[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(plain.PlainPipeline, "cycle", count("plain", real_plain))
    monkeypatch.setattr(speculative, "run", count("speculative", real_spec))
    monkeypatch.setattr(decoder.BatchDecoder, "__init__", count("decoders", real_init))
    result = tune(tiny_model, depths=(1,), prompts=["Hi"], repeats=1, max_tokens=6,
                  save=False, warmup=False)
    assert [r.depth for r in result.rows] == [0, 1]
    assert seen["decoders"] == 2 and seen["plain"] > 0 and seen["speculative"] > 0
    before = dict(seen)
    done = threading.Event()
    # the scheduler decodes on its own thread: it must not resume a conversation an earlier
    # test decoded on this one (MLX's streams are per thread; such a snapshot's unevaluated
    # arrays fail there with "There is no Stream(cpu, 0) in current thread" — in the product
    # one thread hosts the engine core)
    carryover_of(tiny_model).reset_prompt_cache()
    s = Scheduler(model=tiny_model, max_streams=8).start()
    try:
        s.submit(GenRequest(id="r", prompt_ids=(5, 6, 7), max_tokens=6, depth=1),
                 lambda item: done.set() if type(item).__name__ == "Done" else None)
        assert done.wait(60)
    finally:
        s.stop()
    assert seen["decoders"] == before["decoders"] + 1
    assert seen["speculative"] > before["speculative"]
