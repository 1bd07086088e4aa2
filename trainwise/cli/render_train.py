"""What `trainwise train` shows: a header, a live progress line per step, a final summary
with measured numbers next to the prediction."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from trainwise.api.training import StepLog, TrainResult
from trainwise.common.units import human_bytes


def render_header(result: TrainResult, console: Console) -> None:
    plan = result.plan
    knobs = " ".join(f"{k}={v}" for k, v in plan.changed_knobs().items()) or "defaults"
    console.print(f"[bold]trainwise train[/] on {result.device}: {knobs}")
    console.print(f"data: {result.data_description}")
    console.print(f"MFU against: {result.mfu_peak}")
    for note in result.notes:
        console.print(f"note: {note}")


class StepProgress:
    """A rich progress bar on a terminal; plain lines (about ten per run) otherwise."""

    def __init__(self, console: Console, total_steps: int):
        self.console, self.total = console, total_steps
        self.live = console.is_terminal and sys.stdout.isatty()
        self.every = max(1, total_steps // 10)
        self._next_print = self.every  # the first step read at or after it is printed
        self._progress = None
        self._task = None

    def __enter__(self):
        if self.live:
            self._progress = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                                      TextColumn("{task.fields[stats]}"), TimeRemainingColumn(),
                                      console=self.console)
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, stats="")
        return self

    def __exit__(self, *exc):
        if self._progress:
            self._progress.__exit__(*exc)

    def __call__(self, entry: StepLog) -> None:
        if entry.outcome is None:  # a step whose values the run has not read yet (--log-every)
            if self._progress:
                self._progress.update(self._task, completed=entry.step)
            return
        text = step_text(entry)
        if self._progress:
            self._progress.update(self._task, completed=entry.step, stats=text)
        elif entry.step >= self._next_print or entry.step == entry.total_steps:
            self.console.print(f"step {entry.step}/{entry.total_steps}  {text}", highlight=False)
            self._next_print = (entry.step // self.every + 1) * self.every


def step_text(entry: StepLog) -> str:
    """loss, throughput (measured this step), MFU and peak memory so far."""
    outcome = entry.outcome
    parts = [f"loss {outcome.loss:.4f}"]
    if entry.tokens_per_s is not None:  # None on a GPU until the step's timing window closes
        parts += [f"{entry.tokens_per_s:,.0f} tok/s (job)", f"{entry.samples_per_s:,.1f} samples/s (job)"]
    parts.append(f"MFU {100 * entry.mfu:.1f} %" if entry.mfu is not None else "MFU n/a")
    if entry.peak_allocated is not None:
        parts.append(f"peak {human_bytes(entry.peak_allocated)}")
    if outcome.skipped:
        parts.append("[yellow]skipped[/]")
    if entry.eval_loss is not None:
        parts.append(f"eval {entry.eval_loss:.4f}")
    return "  ".join(parts)


def render_summary(result: TrainResult, console: Console) -> None:
    """Time, throughput, MFU and memory (measured) beside the estimate (predicted)."""
    summary, predicted = result.summary, result.predicted or {}
    table = Table(title=f"Run summary ({summary.get('steps', 0)} steps; throughput excludes warm-up, "
                        "compiling and profiled steps)", title_justify="left")
    for column in ("metric", "measured", "predicted", "error"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    table.add_row("time (s)", f"{summary['time_s']:.2f}", "", "")
    if summary.get("compile_s") is not None:
        table.add_row(f"compile (s, {summary['compile_steps']} step(s), not in rates)", f"{summary['compile_s']:.2f}",
                      "", "")
    table.add_row("samples/s (job)", _rate(summary.get("samples_per_s")), "", "")
    table.add_row("tokens/s (job)", _rate(summary.get("tokens_per_s")), "", "")
    if (summary.get("gpus") or 1) > 1:
        table.add_row(f"tokens/s per GPU (of {summary['gpus']})", _rate(summary.get("tokens_per_s_per_gpu")), "", "")
    mfu = summary.get("mfu")
    table.add_row("MFU", f"{100 * mfu:.1f} %" if mfu is not None else "n/a", "", "")
    for key, label in (("peak_allocated", "peak allocated"), ("peak_reserved", "peak reserved"),
                       ("device_total", "device total")):
        table.add_row(label, human_bytes(summary.get(key)), human_bytes(predicted.get(key)),
                      _error(summary.get(key), predicted.get(key)))
    table.add_row("final loss", f"{summary['final_loss']:.4f}" if summary.get("final_loss") is not None else "-",
                  "", "")
    if summary.get("eval_loss") is not None:
        table.add_row("eval loss", f"{summary['eval_loss']:.4f}", "", "")
    if summary.get("skipped_steps"):
        table.add_row("skipped steps", str(summary["skipped_steps"]), "", "")
    console.print(table)
    console.print(f"memory measured by: {summary.get('memory_method')}", highlight=False)
    if padding_note(result):
        console.print(padding_note(result), highlight=False)
    if summary.get("compile_cache"):
        console.print(f"compile cache: {summary['compile_cache']}", highlight=False)
    for report in summary.get("reports") or ():
        console.print(f"logs: {report}", highlight=False, soft_wrap=True)  # a path stays copyable
    outcome = result.outcome
    if outcome and outcome.checkpoint:
        console.print(f"checkpoint: {outcome.checkpoint}")
    for name, path in (outcome.exports if outcome else {}).items():
        console.print(f"{name}: {path}")


def padding_note(result: TrainResult) -> str | None:
    """Why a --chat run's measured memory differs from the prediction: the estimate is for
    full rows of --seq-len tokens, while chat batches are padded only to their longest row."""
    if not getattr(result.run, "chat", None) or not result.predicted:
        return None
    summary = result.summary
    tokens, samples = summary.get("tokens_per_s"), summary.get("samples_per_s")
    rows = (f"; this run's rows averaged {tokens / samples:.0f} tokens (measured)" if tokens and samples else "")
    return (f"note: memory predicted for full rows of {result.plan.seq_len} tokens (--seq-len); --chat pads each "
            f"micro-batch only to its longest conversation (a multiple of 8){rows}, so it measures less")


def _rate(value) -> str:
    return f"{value:,.1f}" if value is not None else "n/a"


def _error(measured, predicted) -> str:
    if not measured or predicted is None:
        return ""
    return f"{100 * (predicted - measured) / measured:+.1f} %"
