"""A bench row measured more than once: every run's figures kept, the row's rates the median.

With several runs (fresh processes) the samples are each run's samples/s; with one run
they are its timed steps' samples/s (samples per step / each step's seconds, one per
timing window on a GPU), so even a single run says how steady it was. The row shows the
median run's memory and the median rate; `spread` (trainwise.common.noise.Spread) says how far the samples fell apart, and
`busy` what the machine was doing when a run started (None: quiet)."""

from __future__ import annotations

import statistics
from typing import Callable

from trainwise.common.noise import Spread

# Each run's figures, kept in the row's "runs".
RUN_KEYS = ("time_s", "samples_per_s", "tokens_per_s", "samples_per_s_per_gpu", "tokens_per_s_per_gpu", "mfu",
            "step_times_s")


def run_repeatedly(run_once: Callable[[], dict], repeat: int, busy: Callable[[], str | None]) -> dict:
    """`repeat` runs of one row, `busy()` asked before each. A run that does not finish
    ("oom", "error", "skipped") ends the row: its row is returned as it is."""
    rows, reasons = [], []
    for _ in range(repeat):
        reasons.append(busy())
        row = run_once()
        if row["status"] != "ok":
            return row
        rows.append(row)
    return combine_runs(rows, next((r for r in reasons if r), None))


def combine_runs(rows: list[dict], busy: str | None) -> dict:
    """One row from the "ok" rows of the same plan and engine (see the module docstring)."""
    by_speed = sorted(rows, key=lambda r: r.get("samples_per_s") or 0.0)
    chosen = dict(by_speed[(len(by_speed) - 1) // 2])
    if len(rows) > 1:
        spread, over = Spread.of(r.get("samples_per_s") for r in rows), "runs"
    else:
        spread, over = _per_step(chosen), "steps"
    chosen["runs"] = [{key: row.get(key) for key in RUN_KEYS} for row in rows]
    chosen.pop("step_times_s", None)
    chosen["spread"] = {**spread.to_json(), "over": over, "unit": "samples/s"}
    chosen["busy"] = busy
    if spread.median and chosen.get("samples_per_s"):
        # Rates of the same steps scale together: tokens/s and MFU follow samples/s.
        scale = spread.median / chosen["samples_per_s"]
        for key in ("samples_per_s", "tokens_per_s", "samples_per_s_per_gpu", "tokens_per_s_per_gpu", "mfu"):
            chosen[key] = chosen[key] * scale if chosen.get(key) is not None else None
    times = [r["time_s"] for r in rows if r.get("time_s") is not None]
    chosen["time_s"] = statistics.median(times) if times else None
    return chosen


def _per_step(row: dict) -> Spread:
    """samples/s of each timed step of one run (the run's own rate alone when it kept no
    step times, as an older results file or another engine may not)."""
    steps = [t for t in row.get("step_times_s") or [] if t and t > 0]
    if not steps or not row.get("samples_per_s"):
        return Spread.of([row.get("samples_per_s")])
    samples_per_step = row["samples_per_s"] * statistics.fmean(steps)
    return Spread.of(samples_per_step / t for t in timing_windows(steps))


def timing_windows(step_times: list[float]) -> list[float]:
    """One time per timing window: a GPU run times the steps between two reads of the
    device together and gives each the window's mean (engine/pending_steps.py), so equal
    neighbours are one measurement, not several that agree (a CPU run times every step)."""
    return [t for index, t in enumerate(step_times) if index == 0 or t != step_times[index - 1]]
