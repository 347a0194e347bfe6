"""``bench``'s report: every decoder against its class's fastest fixed depth, and ``auto``'s
ratio to it (median and repeat by repeat); ``bench --simulate`` prints the simulator's table."""
from __future__ import annotations

import json
import sys

import pytest

from engine.bench import adaptive_sim
from engine.bench.side_by_side import (Cell, _report, auto_vs_best_fixed, best_fixed,
                                      peer_ratios)
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


def _peer_rows() -> dict:
    ids = {0: [5, 6, 7, 2], 1: [8, 9, 2]}
    cells = {"mlx_lm": Cell(tps=[200.0], tokens=dict(ids)),
             "mlx_vlm": Cell(tps=[220.0], tokens={0: [5, 6, 7, 2], 1: [8, 4, 2]}),
             "vlm_d2": Cell(tps=[250.0], tokens=dict(ids)),
             "vlm_d3": Cell(tps=[275.0], tokens=dict(ids)),
             "0": Cell(tps=[240.0], tokens=dict(ids)), "3": Cell(tps=[330.0], tokens=dict(ids))}
    return _report(cells, same_tokens=True)


def test_greedy_rows_count_the_prompts_whose_tokens_equal_depth_0s():
    rows = _peer_rows()
    assert rows["mlx_lm"]["same_tokens_as_depth0"] == [2, 2]
    assert rows["mlx_vlm"]["same_tokens_as_depth0"] == [1, 2]  # prompt 1 differs
    assert "same_tokens_as_depth0" not in rows["0"]
    sampled = _report({"0": Cell(tps=[1.0], tokens={0: [1]}), "3": Cell(tps=[1.0], tokens={0: [2]})})
    assert "same_tokens_as_depth0" not in sampled["3"]  # sampled replies may differ


def test_the_best_depth_against_mlx_lm_and_mlx_vlms_fastest_mtp_setting(capsys):
    rows = _peer_rows()
    peers = peer_ratios(rows)
    assert peers["best_depth"] == 3 and peers["vlm_best"] == "vlm_d3"  # not a fixed depth
    assert peers["best_vs_mlx_lm"] == round(330 / 200, 3)
    assert peers["best_vs_mlx_vlm_mtp"] == 1.2  # 330 / 275
    assert peers["depth0_vs_mlx_vlm"] == round(240 / 220, 3)
    _print_class("prompts", rows, None, profile=False, peers=peers)
    text = capsys.readouterr().out
    assert "best depth (3) / mlx-lm 1.65x, / mlx-vlm MTP (vlm_d3) 1.20x" in text
    assert " 1/2 " in text.splitlines()[4]  # mlx_vlm's row, the ids column
    assert peer_ratios({"0": rows["0"], "3": rows["3"]})["best_vs_mlx_vlm_mtp"] is None


def test_bench_says_why_mlx_vlm_is_not_in_the_table(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlx_vlm", None)  # importing it raises ImportError
    assert main(["bench", "--depths", "0,2", "--repeats", "1", "--max-tokens", "6",
                 "--prompt", "What does os.path.join do?"]) == 0
    text = capsys.readouterr().out
    assert "mlx-vlm: mlx-vlm is not installed" in text
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.strip()}
    assert " 1/1 " in lines["2"] and " 1/1 " in lines["mlx_lm"]  # greedy: the same tokens
    assert "mlx_vlm" not in lines


def test_mlx_vlms_plain_and_mtp_decoding_give_this_engines_tokens():
    """Where mlx-vlm is installed (not a dependency: ``pip install mlx-vlm``), its plain and
    MTP decoding run on the demo's weights (its drafter made by its own ``split_mtp``)."""
    pytest.importorskip("mlx_vlm")
    from engine import SamplingParams, default_model_path, load
    from engine.bench.side_by_side import MlxVlmPeer, run_bench

    model = load(default_model_path())
    vlm, why = MlxVlmPeer.make(model.info.path, want_mtp=True)
    assert vlm is not None, why
    prompts = {"p": ["What does os.path.join do?", "Explain json.dumps."]}
    out = run_bench(model, prompts=prompts, depths=[0, 3], max_tokens=24, repeats=1,
                    params=SamplingParams(temperature=0.0), include_mlx_lm=False, vlm=vlm,
                    vlm_drafts=(1, 3))
    rows = out["classes"]["p"]
    assert list(rows) == ["mlx_vlm", "vlm_d1", "vlm_d3", "0", "3"]
    for lab in ("mlx_vlm", "vlm_d1", "vlm_d3", "3"):
        assert rows[lab]["same_tokens_as_depth0"] == [2, 2], lab
        assert rows[lab]["tok_s"] > 0
    assert out["peers"]["p"]["vlm_best"] in ("vlm_d1", "vlm_d3")
