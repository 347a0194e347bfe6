"""``bench --streams`` on a tiny model: every cell reports aggregate tok/s and the anatomy of
its cycles with every stream in the batch, and the anatomy table reads them right."""
from __future__ import annotations

import pytest

from engine.bench.streams import PHASES, _anatomy, _print_anatomy, streams_bench
from engine.types import CycleStats, SamplingParams

TEXTS = ["Explain how a hash table works.", "def hello(name): return f'hello {name}'"]


def _stats(accepted: int, rows: int, **t) -> CycleStats:
    return CycleStats(index=0, depth=2, drafted=(5, 6), accepted=accepted,
                      emitted=(5,) * (accepted + 1), from_draft=(True,) * accepted + (False,),
                      extra_kind="bonus", batch_rows=rows, **t)


def test_anatomy_takes_each_cycle_once_and_every_row_tokens():
    t1 = dict(t_total=0.010, t_draft=0.002, t_verify=0.006, t_accept=0.001, t_sync=0.0005,
              t_commit=0.0005)
    t2 = dict(t_total=0.030, t_draft=0.004, t_verify=0.020, t_accept=0.002, t_sync=0.003,
              t_commit=0.001)
    t3 = dict(t_total=0.020, t_draft=0.003, t_verify=0.012, t_accept=0.002, t_sync=0.002,
              t_commit=0.001)
    a = _anatomy({1: [_stats(2, 2, **t1), _stats(0, 2, **t1)],
                  2: [_stats(1, 2, **t2), _stats(1, 2, **t2)],
                  3: [_stats(2, 2, **t3), _stats(2, 2, **t3)]})
    assert a["cycles"] == 3
    assert a["total"] == pytest.approx(0.020) and a["verify"] == pytest.approx(0.012)
    assert a["accept"] == pytest.approx(0.004)  # the host sync's wait counts as accept
    assert a["tokens_per_row"] == pytest.approx((3 + 1 + 2 + 2 + 3 + 3) / 6)
    assert _anatomy({}) == {}


def test_streams_bench_reports_each_cells_cycles(tiny_model, capsys):
    res = streams_bench(tiny_model, streams=[1, 2], depths=[0, 2], max_tokens=8, texts=TEXTS,
                        params=SamplingParams(temperature=0), repeats=1, replay=True)
    for b in (1, 2):
        assert set(res["aggregate_tok_s"][b]) == {"mlx_lm", "0", "2r"}
        cells = res["anatomy"][b]
        assert set(cells) <= {"0", "2r"} and "2r" in cells
        for lab, a in cells.items():
            assert a["cycles"] >= 1 and a["total"] > 0
            parts = sum(a[p] for p in PHASES if p != "total")
            assert parts <= a["total"] * 1.0001
        # the replay drafts the stream's own depth-0 output: every draft is accepted, a
        # cycle gives a row up to 3 tokens (fewer only where the token budget clips it)
        assert 1.5 <= cells["2r"]["tokens_per_row"] <= 3
        assert cells["2r"]["draft"] > 0
        if "0" in cells:
            assert cells["0"]["tokens_per_row"] == 1 and cells["0"]["draft"] == 0
    _print_anatomy(res["anatomy"], res["aggregate_tok_s"], [1, 2])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("cycles with every stream")
    fastest_one = max((lab for lab in res["anatomy"][1]), key=res["aggregate_tok_s"][1].get)
    one = [ln.split() for ln in lines[2:] if ln.split()[:2] == ["1", fastest_one]]
    assert one and one[0][-1] == "1.00x"  # one stream's fastest cell against itself
