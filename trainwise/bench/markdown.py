"""results.md: the bench table as Markdown with the command and versions, ready to commit
under docs/results/ (the figures are the measured and predicted ones from results.json)."""

from __future__ import annotations

import platform

from trainwise.bench.baseline_ratio import baseline_ratio
from trainwise.common.noise import SPREAD_LIMIT, spread_text
from trainwise.common.units import bytes_or_na, signed_percent


def results_markdown(rows: list[dict], command: str, device: str) -> str:
    import torch
    import transformers

    columns = _columns(rows)
    lines = [f"# bench on {device}", "",
             f"Command: `{command}`", "",
             f"Versions: Python {platform.python_version()}, torch {torch.__version__}, "
             f"transformers {transformers.__version__}; {platform.platform()}", "",
             "Times and rates are measured, leaving out the warm-up step (and, on a CPU, the step whose "
             "memory is profiled); rates are the median of the row's samples (each run's rate when a row ran "
             "more than once, else each timed step's), spread = (max - min) / median of them (the fastest and "
             "slowest left out from 5 samples on). vs HF Trainer is the ratio of the medians, shown only when "
             f"both spreads are at most {spread_text(SPREAD_LIMIT)} and the machine was not busy. "
             "Memory is measured and predicted (`trainwise estimate` for the same plan); "
             "error = (predicted - measured) / measured. n/a: no such figure.", "",
             "| " + " | ".join(header for header, _ in columns) + " |",
             "|" + "|".join("---" if i < 3 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(cell(row) for _, cell in columns) + " |" for row in rows]
    methods = sorted({r["memory_method"] for r in rows if r.get("memory_method")})
    notes = sorted({n for r in rows for n in r.get("notes") or []} | {r["busy"] for r in rows if r.get("busy")})
    lines += [""] + [f"Memory measured by: {m}" for m in methods] + [f"Note: {n}" for n in notes]
    if not any(r["measured"].get("device_total") is not None for r in rows):
        lines.append("Peak reserved and device total are not shown: this device has no allocator cache "
                     "or context to measure.")
    return "\n".join(lines + [""])


def _columns(rows: list[dict]) -> list[tuple]:
    """(header, row -> cell) for each column; figures no row measured are left out."""
    baseline = {r["name"]: r for r in rows if r["engine"] == "hf-trainer"}
    columns = [("row", lambda r: r["name"]), ("engine", lambda r: r["engine"]), ("status", _status),
               ("time (s)", lambda r: _num(r.get("time_s"), ".1f")),
               ("samples/s (job, median)", lambda r: _num(r.get("samples_per_s"), ",.1f")),
               ("spread", _spread),
               ("tokens/s (job)", lambda r: _num(r.get("tokens_per_s"), ",.0f"))]
    if any(r.get("mfu") is not None for r in rows):
        columns.append(("MFU", lambda r: f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else "n/a"))
    columns += _memory_columns("peak alloc", "peak_allocated", with_error=True)
    if any(r["measured"].get("peak_reserved") is not None for r in rows):
        columns += _memory_columns("peak reserved", "peak_reserved", with_error=False)
    if any(r["measured"].get("device_total") is not None for r in rows):
        columns += _memory_columns("device total", "device_total", with_error=True)
    if baseline:
        columns.append(("samples/s vs HF Trainer", lambda r: _ratio(r, baseline.get(r["name"]))))
    return columns


def _memory_columns(label: str, key: str, with_error: bool) -> list[tuple]:
    columns = [(f"{label} measured", lambda r: bytes_or_na(r["measured"].get(key))),
               (f"{label} predicted", lambda r: bytes_or_na(r["predicted"].get(key)))]
    if with_error:
        columns.append((f"{label} error", lambda r: signed_percent(r["error_pct"].get(key))))
    return columns


def _status(row: dict) -> str:
    status = row["status"] + (f": {row['reason']}" if row["status"] != "ok" and row.get("reason") else "")
    return status.replace("|", "/")


def _ratio(row: dict, baseline: dict | None) -> str:
    ratio = baseline_ratio(row, baseline)
    return "" if ratio is None else ratio.text().replace("|", "/")


def _spread(row: dict) -> str:
    spread = row.get("spread")
    if not spread or spread["spread_pct"] is None:
        return "n/a"
    return f"{spread['spread_pct']:.0f} % over {spread['n']} {spread['over']}"


def _num(value, spec: str) -> str:
    return format(value, spec) if value is not None else "n/a"
