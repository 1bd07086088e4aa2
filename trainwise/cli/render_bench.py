"""The bench table: one line per row; memory measured vs predicted; trainwise vs the Trainer."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainwise.api.benchmark import baseline_ratio
from trainwise.common.noise import SPREAD_LIMIT, spread_text
from trainwise.common.units import bytes_or_na, signed_percent


def render_row(row: dict, console: Console) -> None:
    """One progress line as each row finishes."""
    figures = ""
    if row["status"] == "ok":
        figures = (f"{_num(row.get('samples_per_s'), ',.1f')} samples/s{_spread_note(row)}, "
                   f"peak {bytes_or_na(row['measured'].get('peak_allocated'))} (measured)"
                   + (f"; {row['busy']}" if row.get("busy") else ""))
    console.print(f"{row['status']:<8} {row['engine']:<10} {row['name']:<24} {figures}{row.get('reason') or ''}",
                  highlight=False, markup=False)


def render_bench(rows: list[dict], console: Console, out) -> None:
    """The whole table, then what each figure is and where the files are."""
    measured_reserved = any(r["measured"].get("peak_reserved") is not None for r in rows)
    measured_total = any(r["measured"].get("device_total") is not None for r in rows)
    has_mfu = any(r.get("mfu") is not None for r in rows)
    baseline = {r["name"]: r for r in rows if r["engine"] == "hf-trainer"}
    columns = ["row", "engine", "status", "time (s)", "samples/s\n(job, median)", "spread", "tokens/s\n(job)"] + (
        ["MFU"] if has_mfu else []) + [
        "peak alloc\nmeasured", "peak alloc\npredicted", "error"]
    if measured_reserved:
        columns += ["reserved\nmeasured", "reserved\npredicted"]
    if measured_total:
        columns += ["device total\nmeasured", "device total\npredicted", "error "]
    if baseline:
        columns.append("samples/s vs\nHF Trainer")
    table = Table(title="bench: rates exclude the warm-up step; memory is the peak of one training step",
                  title_justify="left")
    for column in columns:
        table.add_column(column, justify="left" if column in ("row", "engine", "status") else "right")
    reasons: list[str] = []
    for row in rows:
        measured, predicted, error = row["measured"], row["predicted"], row["error_pct"]
        cells = [row["name"], "trainwise" if row["engine"] == "trainwise" else "HF Trainer",
                 _status(row, reasons), _num(row.get("time_s"), ".1f"), _num(row.get("samples_per_s"), ",.1f"),
                 _spread_cell(row), _num(row.get("tokens_per_s"), ",.0f")]
        if has_mfu:
            cells.append(f"{100 * row['mfu']:.1f} %" if row.get("mfu") is not None else "n/a")
        cells += [bytes_or_na(measured.get("peak_allocated")), bytes_or_na(predicted.get("peak_allocated")),
                  signed_percent(error.get("peak_allocated"))]
        if measured_reserved:
            cells += [bytes_or_na(measured.get("peak_reserved")), bytes_or_na(predicted.get("peak_reserved"))]
        if measured_total:
            cells += [bytes_or_na(measured.get("device_total")), bytes_or_na(predicted.get("device_total")),
                      signed_percent(error.get("device_total"))]
        if baseline:
            cells.append(_ratio(row, baseline.get(row["name"]), reasons))
        table.add_row(*cells)
    console.print(table)
    for number, reason in enumerate(reasons, 1):
        console.print(f"[{number}] {reason}", highlight=False, markup=False)
    _explain(rows, console, measured_reserved or measured_total, bool(baseline), out)


def _explain(rows: list[dict], console: Console, has_device_figures: bool, has_baseline: bool, out) -> None:
    for method in sorted({r["memory_method"] for r in rows if r.get("memory_method")}):
        console.print(f"measured memory: {method}", highlight=False, markup=False)
    console.print("predicted memory: `trainwise estimate` for the same plan (traced on fake tensors); "
                  "error = (predicted - measured) / measured", highlight=False, markup=False)
    if not has_device_figures:
        console.print("peak reserved and device total: n/a, this device reports no allocator cache or "
                      "context to measure", highlight=False, markup=False)
    console.print("samples/s: the median of the row's samples (each run's rate with --repeat above 1, else each "
                  "timed step's); spread = (max - min) / median of them (from 5 samples on, the fastest and "
                  "slowest left out); measured", highlight=False, markup=False)
    if has_baseline:
        console.print("vs HF Trainer: trainwise's median samples/s over the Trainer's for the same row (above "
                      f"1.00x: trainwise is faster), shown only when both spreads are at most "
                      f"{spread_text(SPREAD_LIMIT)} and the machine was not busy", highlight=False, markup=False)
    notes = sorted({note for r in rows for note in r.get("notes") or []})
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    console.print(f"results: {out}/results.json, {out}/results.csv, {out}/results.md; chart: {out}/chart.png",
                  highlight=False, markup=False)


def _status(row: dict, reasons: list[str]) -> str:
    """The status, with a footnote number for its reason (reasons are long)."""
    if row["status"] == "ok" or not row.get("reason"):
        return row["status"]
    return f"{row['status']} {_footnote(row['reason'], reasons)}"


def _footnote(reason: str, reasons: list[str]) -> str:
    if reason not in reasons:
        reasons.append(reason)
    return f"[{reasons.index(reason) + 1}]"


def _ratio(row: dict, other: dict | None, reasons: list[str]) -> str:
    """The ratio, or "not shown [n]" with the footnote saying why (busy machine, spread)."""
    ratio = baseline_ratio(row, other)
    if ratio is None:
        return ""
    if ratio.value is None:
        return "not shown " + _footnote(f"vs HF Trainer not shown: {ratio.withheld}", reasons)
    return ratio.text()


def _spread_cell(row: dict) -> str:
    spread = row.get("spread")
    if not spread or spread["spread_pct"] is None:
        return "n/a"
    return f"{spread['spread_pct']:.0f} %"


def _spread_note(row: dict) -> str:
    spread = row.get("spread")
    if not spread or spread["spread_pct"] is None:
        return ""
    return f" (median of {spread['n']} {spread['over']}, spread {spread['spread_pct']:.0f} %)"


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)
