"""``bench``'s report: every decoder against its class's fastest fixed depth, and ``auto``'s
ratio to it (median and repeat by repeat); ``bench --simulate`` prints the simulator's table."""
from __future__ import annotations

import json

from engine.bench import adaptive_sim
from engine.bench.side_by_side import Cell, _report, auto_vs_best_fixed, best_fixed
from engine.cli import main
from engine.commands.bench import _print_class


def _rows() -> dict:
    cells = {"mlx_lm": Cell(tps=[210.0, 200.0, 205.0]), "0": Cell(tps=[200.0, 190.0, 195.0]),
             "1": Cell(tps=[280.0, 270.0, 290.0]), "3": Cell(tps=[300.0, 320.0, 310.0]),
             "auto": Cell(tps=[297.0, 304.0, 299.0])}
    return _report(cells)


def test_each_decoder_is_measured_against_the_fastest_fixed_depth():
    rows = _rows()
    assert best_fixed(rows) == "3"  # mlx_lm and auto are not fixed depths
    assert rows["3"]["vs_best_fixed"] == 1.0
    assert rows["auto"]["vs_best_fixed"] == round(299.0 / 310.0, 3)
    assert rows["0"]["vs_best_fixed"] == round(195.0 / 310.0, 3)


def test_auto_against_the_best_fixed_depth_median_and_by_repeat():
    out = auto_vs_best_fixed(_rows())
    assert out["best_depth"] == 3
    assert out["ratio"] == round(299.0 / 310.0, 3)
    assert out["ratio_by_repeat"] == [0.99, 0.95, 0.965]  # 297/300, 304/320, 299/310
    no_auto = {k: v for k, v in _rows().items() if k != "auto"}
    assert auto_vs_best_fixed(no_auto)["ratio"] is None


def test_the_table_has_a_vs_best_column_and_an_auto_line(capsys):
    rows = _rows()
    _print_class("mixed", rows, auto_vs_best_fixed(rows), profile=False)
    text = capsys.readouterr().out
    assert "vs best" in text.splitlines()[2]  # after a blank line and "[mixed]"
    assert "auto / best fixed depth (3): 0.965 (by repeat: 0.990 0.950 0.965)" in text


def test_bench_simulate_needs_no_model(monkeypatch, capsys):
    small, asked = adaptive_sim.table, []

    def table(workloads, **kw):  # the synthetic and the recorded workloads; runs the first
        asked.extend(w.name for w in workloads)
        return small(workloads=workloads[:1], starts=("seeded",), runs=1, replies=4, **kw)
    monkeypatch.setattr(adaptive_sim, "table", table)
    assert main(["bench", "--simulate", "--json", "--max-tokens", "64"]) == 0
    assert {"demo-T0", "rough-T0.7", "recorded-demo-T0", "recorded-demo-T0.7"} <= set(asked)
    rows = json.loads(capsys.readouterr().out)
    assert [r["class"] for r in rows] == ["in-domain", "out-of-domain", "mixed"]
    assert all(r["workload"] == "demo-T0" and 0.5 < r["ratio"] < 1.5 for r in rows)
    assert main(["bench", "--simulate", "--max-tokens", "64"]) == 0
    assert "auto/best" in capsys.readouterr().out
