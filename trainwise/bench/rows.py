"""Bench rows: the row contract of docs/train.md, built from a run's metrics summary."""

from __future__ import annotations

import json
from pathlib import Path

MEMORY_KEYS = ("peak_allocated", "peak_reserved", "device_total")
# A row's rates are its run's: samples/s and tokens/s the whole job's (a bench row runs on
# one device, so the job's and the per-GPU figures are one), per GPU beside them.
RATE_KEYS = ("time_s", "samples_per_s", "tokens_per_s", "samples_per_s_per_gpu", "tokens_per_s_per_gpu", "mfu")
ENGINES = ("trainwise", "hf-trainer")
# Knobs every row shows even at their defaults: a ladder is about these.
SHOWN_KNOBS = ("batch_size", "grad_accum", "seq_len", "precision", "optim")


def row_plan(plan) -> dict:
    """A row's "plan": the ladder's core knobs, plus every other knob off its default."""
    return {**{name: getattr(plan, name) for name in SHOWN_KNOBS}, **plan.changed_knobs()}


def empty_row(name: str, plan: dict, engine: str, status: str, reason: str = "") -> dict:
    return {"name": name, "plan": plan, "engine": engine, "status": status, "reason": reason,
            "time_s": None, "samples_per_s": None, "tokens_per_s": None, "samples_per_s_per_gpu": None,
            "tokens_per_s_per_gpu": None, "mfu": None,
            "measured": {k: None for k in MEMORY_KEYS}, "predicted": {k: None for k in MEMORY_KEYS},
            "error_pct": {"peak_allocated": None, "device_total": None}, "memory_method": None, "notes": []}


def row_from_summary(name: str, plan: dict, engine: str, summary: dict, predicted: dict | None) -> dict:
    """An "ok" row from a metrics summary (measured) and the estimate (predicted)."""
    row = empty_row(name, plan, engine, "ok")
    for key in RATE_KEYS:
        row[key] = summary.get(key)
    row["measured"] = {k: summary.get(k) for k in MEMORY_KEYS}
    row["memory_method"] = summary.get("memory_method")
    row["step_times_s"] = summary.get("step_times_s")  # each timed step's seconds (bench/repeats.py)
    if predicted:
        row["predicted"] = {k: predicted.get(k) for k in MEMORY_KEYS}
        row["error_pct"] = {k: error_pct(row["predicted"][k], row["measured"][k])
                            for k in ("peak_allocated", "device_total")}
    return row


def error_pct(predicted, measured) -> float | None:
    """(predicted - measured) / measured in %, None when either is missing."""
    if predicted is None or not measured:
        return None
    return round(100.0 * (predicted - measured) / measured, 2) + 0.0  # + 0.0: no "-0.0" in the files


def read_summary(metrics: Path) -> dict | None:
    """The {"summary": ...} line of a metrics file, or None when the run wrote none."""
    if not metrics.is_file():
        return None
    for line in reversed(metrics.read_text().splitlines()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "summary" in record:
            return record["summary"]
    return None
