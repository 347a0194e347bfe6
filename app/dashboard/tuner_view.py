"""The dashboard's tuner card filled from a tuning result (``TuneResult.to_dict()``, or the
one saved for the model on this machine): the table of depths, the bar chart of tok/s against
plain decoding, the winner line and the tuner's message."""
from __future__ import annotations

from PySide6.QtWidgets import QLabel, QTableWidget, QTableWidgetItem

from app.dashboard.charts import BLUE, GREEN, GREY, BarChart


def show_tuning(t: dict | None, *, table: QTableWidget, chart: BarChart, sub: QLabel,
                message: QLabel) -> None:
    table.setRowCount(0)
    if not t:
        chart.set_bars([])
        sub.setText("not run on this machine yet")
        return
    winner = t.get("best_depth", 0)
    rows = t.get("rows", [])
    table.setRowCount(len(rows))
    for i, r in enumerate(rows):
        acc = " / ".join(f"{a:.2f}" for a in r.get("acceptance", ())) or "–"
        cells = (f"D{r['depth']}" + ("  ★" if r["depth"] == winner and winner else ""),
                 f"{r['tokens_per_second']:.1f}", f"{r['speedup']:.2f}×",
                 f"{r['tokens_per_cycle']:.2f}", acc)
        for j, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if r["depth"] == winner:
                f = item.font()
                f.setBold(True)
                item.setFont(f)
            table.setItem(i, j, item)
    base = t.get("baseline_tps", 0.0)
    chart.set_bars(
        [(f"D{r['depth']}", r["tokens_per_second"],
          GREEN if r["depth"] == winner and winner else GREY if r["depth"] == 0 else BLUE,
          f"{r['speedup']:.2f}×") for r in rows],
        reference=("plain decoding", base) if base else None)
    saved = "saved" if t.get("saved") else "not saved"
    sub.setText(f"winner: D{winner} ({saved})" if winner else "winner: plain decoding")
    message.setText(t.get("message", ""))
