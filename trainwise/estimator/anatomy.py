"""Replay a StepTrace's allocation timeline: the peak, and what is alive at the peak."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from trainwise.trace.step_trace_data import StepTrace
from trainwise.trace.storage import ALLOC


@dataclass(frozen=True)
class Anatomy:
    """Bytes per category. `totals`: weights, buffers, gradients and optimizer state as held
    in steady state, activations as saved for backward at the end of a forward pass.
    `at_peak`: live bytes per category at the moment of the peak (these add up to
    `peak_allocated`). Block sizes are as the allocator sees them (`block_size`)."""

    totals: dict[str, int]
    at_peak: dict[str, int]
    peak_allocated: int
    peak_phase: str
    peak_module: str
    phase_at_peak: dict[str, dict[str, int]]  # live bytes per category at each phase's own peak


def replay(trace: StepTrace, block_size=lambda nbytes: nbytes, extra_allocations=()) -> Anatomy:
    """Walk the events in order. `block_size` maps a request to the bytes the device
    allocator books (CUDA rounds to 512 B); `extra_allocations` are (category, nbytes)
    blocks alive for the whole step (e.g. cuBLAS workspaces)."""
    records = trace.records
    live = Counter()
    for category, nbytes in extra_allocations:
        live[category] += block_size(nbytes)
    live_total = sum(live.values())
    peak, peak_at, peak_live = -1, 0, Counter()
    max_activations = 0
    phase_starts = {start: name for name, start in trace.phase_starts}
    phase, phase_peaks = "setup", {}  # phase: (its peak, live bytes per category there)
    for index, (kind, key) in enumerate(trace.events):
        phase = phase_starts.get(index, phase)
        record = records[key]
        size = block_size(record.nbytes)
        sign = 1 if kind == ALLOC else -1
        live[record.category] += sign * size
        live_total += sign * size
        if index < trace.window_start:
            continue
        if live_total > peak:
            peak, peak_at, peak_live = live_total, index, live.copy()
        if live_total > phase_peaks.get(phase, (-1,))[0]:
            phase_peaks[phase] = (live_total, live.copy())
        max_activations = max(max_activations, live["activations"])
    totals = _steady_state_totals(trace)
    totals["activations"] = max_activations if block_size(1) == 1 else _raw_activations(trace)
    totals["temporary"] = peak_live["temporary"]
    return Anatomy(totals=totals, at_peak=dict(peak_live), peak_allocated=max(peak, 0),
                   peak_phase=_phase_at(trace, peak_at), peak_module=records[trace.events[peak_at][1]].module,
                   phase_at_peak={name: dict(live) for name, (_, live) in phase_peaks.items()})


def _steady_state_totals(trace: StepTrace) -> dict[str, int]:
    """Bytes of every storage in the persistent categories (one step's worth of gradients)."""
    totals = Counter()
    for record in trace.records:
        if record.category in ("weights", "buffers", "optimizer"):
            totals[record.category] += record.nbytes
        elif record.category == "gradients" and record.phase not in ("setup",):
            totals["gradients"] += record.nbytes
    return {c: totals.get(c, 0) for c in ("weights", "buffers", "gradients", "optimizer")}


def _raw_activations(trace: StepTrace) -> int:
    """Largest unrounded saved-activation bytes alive at once inside the window."""
    live = peak = 0
    records = trace.records
    for index, (kind, key) in enumerate(trace.events):
        record = records[key]
        if record.category != "activations":
            continue
        live += record.nbytes if kind == ALLOC else -record.nbytes
        if index >= trace.window_start:
            peak = max(peak, live)
    return peak


def _phase_at(trace: StepTrace, event_index: int) -> str:
    phase = "setup"
    for name, start in trace.phase_starts:
        if start <= event_index:
            phase = name
    return phase
