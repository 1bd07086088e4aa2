"""The bench table: one line per row; memory measured vs predicted; trainwise vs the Trainer."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainwise.plan.units import human_bytes


def render_row(row: dict, console: Console) -> None:
    """One progress line as each row finishes."""
    speed = f"{row['samples_per_s']:.1f} samples/s" if row.get("samples_per_s") else ""
    console.print(f"[{row['status']}] {row['engine']:<10} {row['name']:<24} {speed} {row.get('reason') or ''}",
                  highlight=False, markup=False)


def render_bench(rows: list[dict], console: Console, out) -> None:
    table = Table(title="bench (m: measured, p: predicted; rates exclude the warm-up step)", title_justify="left")
    for column in ("row", "engine", "status", "time s", "samples/s", "tokens/s", "MFU",
                   "peak m", "peak p", "err", "dev total m", "vs HF"):
        table.add_column(column, justify="left" if column in ("row", "engine", "status") else "right")
    baseline = {r["name"]: r for r in rows if r["engine"] == "hf-trainer"}
    reasons: list[str] = []
    for row in rows:
        measured, predicted = row["measured"], row["predicted"]
        error = row["error_pct"].get("peak_allocated")
        ratio = ""
        other = baseline.get(row["name"])
        if row["engine"] == "trainwise" and other and row.get("samples_per_s") and other.get("samples_per_s"):
            ratio = f"{row['samples_per_s'] / other['samples_per_s']:.2f}x"
        status = row["status"]
        if status != "ok" and row.get("reason"):
            if row["reason"] not in reasons:
                reasons.append(row["reason"])
            status += f" [{reasons.index(row['reason']) + 1}]"
        table.add_row(row["name"], "trainwise" if row["engine"] == "trainwise" else "HF", status,
                      _num(row.get("time_s"), ".1f"), _num(row.get("samples_per_s"), ",.1f"),
                      _num(row.get("tokens_per_s"), ",.0f"),
                      f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "n/a",
                      human_bytes(measured.get("peak_allocated")), human_bytes(predicted.get("peak_allocated")),
                      f"{error:+.1f}%" if error is not None else "", human_bytes(measured.get("device_total")), ratio)
    _drop_empty_columns(table)
    console.print(table)
    for number, reason in enumerate(reasons, 1):
        console.print(f"[{number}] {reason}", highlight=False, markup=False)
    methods = {r.get("memory_method") for r in rows if r.get("memory_method")}
    for method in sorted(methods):
        console.print(f"memory measured by: {method}", highlight=False)
    console.print("vs HF: trainwise samples/s over the Hugging Face Trainer's for the same row; "
                  "'-' where a figure does not exist on this device")
    console.print(f"results: {out}/results.json, {out}/results.csv, chart: {out}/chart.png")


def _num(value, spec: str) -> str:
    return format(value, spec) if value is not None else "n/a"


def _drop_empty_columns(table: Table) -> None:
    """Columns with no figure on this device (device total and MFU on a CPU) only take room."""
    empty = {"", "-", "n/a"}
    table.columns[:] = [c for c in table.columns
                        if c.header in ("row", "engine", "status") or any(str(v) not in empty for v in c._cells)]
