"""The verify table: each plan's predicted and measured step time and peak memory side by
side, then the verdict and what was written into the device profile."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainwise.common.units import bytes_or_na, signed_percent
from trainwise.plan import Plan


def plan_flags(plan: Plan) -> str:
    """The command-line flags that set `plan`'s knobs off their defaults (the device aside:
    verify runs on the device present)."""
    parts = []
    for spec in Plan.specs():
        value = getattr(plan, spec.name)
        if value == spec.default or spec.name == "device":
            continue
        parts.append(spec.flag if value is True else f"{spec.flag} {value}")
    return " ".join(parts) or "(defaults)"


def render_verify(report, console: Console) -> None:
    """The table, its footnotes, the verdict lines and the corrections line."""
    table = Table(title=f"verify: {report.model} on {report.device_name}, {report.repeat} run(s) per plan x "
                        f"{report.steps} steps (the first {report.timing_warmup} not timed), each in a fresh process",
                  title_justify="left")
    for column in ("#", "plan", "status", "step time (s)\npredicted", "step time (s)\nmeasured, median",
                   "spread\nmeasured", "step time\nmeasured /\npredicted", "peak memory\npredicted",
                   "peak memory\nmeasured", "memory error"):
        table.add_column(column, justify="left" if column in ("#", "plan", "status") else "right")
    reasons: list[str] = []
    for index, entry in enumerate(report.entries):
        mark = " (recommended)" if index == report.recommended else ""
        table.add_row(f"{entry.rank}{mark}", plan_flags(entry.candidate.plan), _status(entry, reasons),
                      f"{entry.predicted_step_s:.3f}", _num(entry.measured_step_s, ".3f"), _spread(entry),
                      _num(entry.step_ratio, ".2f", "x"), bytes_or_na(entry.predicted_memory_bytes),
                      bytes_or_na(entry.measured_memory_bytes), signed_percent(_memory_error(entry)))
    console.print(table)
    for number, reason in enumerate(reasons, 1):
        _say(console, f"[{number}] {reason}")
    _explain(report, console)


def _explain(report, console: Console) -> None:
    _say(console, "predicted: the search's figures (step time from the time model, peak memory the device "
                  "total of the estimate); measured: step time per optimizer step over the timed steps, the "
                  "median of the runs; spread = (slowest - fastest) / median over the runs")
    kinds = sorted({e.memory_kind for e in report.entries if e.memory_kind})
    if kinds:
        _say(console, f"measured peak memory: {', '.join(kinds)} (the largest of the runs); "
                      "memory error = (predicted - measured) / measured")
    for line in report.lines:
        _say(console, line)
    if report.busy and not any(report.busy in line for line in report.lines):
        _say(console, f"warning: {report.busy}")
    if report.corrections_note:
        _say(console, report.corrections_note)


def _status(entry, reasons: list[str]) -> str:
    """The status, with a footnote number for its reason (reasons are long)."""
    if entry.status == "ok" or not entry.message:
        return entry.status
    if entry.message not in reasons:
        reasons.append(entry.message)
    return f"{entry.status} [{reasons.index(entry.message) + 1}]"


def _spread(entry) -> str:
    if entry.spread is None:
        return "n/a (1 run)" if len(entry.measured_runs_s) == 1 else "n/a"
    return f"{100 * entry.spread:.1f} %"


def _memory_error(entry) -> float | None:
    if entry.measured_memory_bytes is None or not entry.measured_memory_bytes:
        return None
    return 100.0 * (entry.predicted_memory_bytes - entry.measured_memory_bytes) / entry.measured_memory_bytes


def _num(value, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else format(value, spec) + suffix


def _say(console: Console, text: str) -> None:
    console.print(text, highlight=False, markup=False)
