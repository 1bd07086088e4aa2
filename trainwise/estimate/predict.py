"""The one-device estimate: trace the step on fake tensors and read its memory.

A model with more than a few identical blocks is traced at 2 and 3 blocks
(trainwise/trace/depth.py) and read at full depth: the 3-block timeline repeated and
replayed where the blocks repeat cleanly, else a line through the two traces' figures
(trainwise/estimate/extrapolate.py). The per-rank estimate (layout_estimate.py) runs this
on each rank's workload."""

from __future__ import annotations

import dataclasses
from collections import Counter

from trainwise.estimate.extrapolate import (CannotSynthesize, extrapolate_dataclass, extrapolated_stacks,
                                             same_timeline, synthesize_trace)
from trainwise.estimate.memory import MemoryEstimate, memory_from_trace
from trainwise.estimate.result import EstimateResult
from trainwise.estimate.step_time import predict_step_time
from trainwise.hardware import Device
from trainwise.hardware.profile import DeviceProfile
from trainwise.models import ModelSpec, build_model_with_notes, example_batch
from trainwise.plan.plan import Plan
from trainwise.trace.depth import TRACED_BLOCKS, block_count, should_extrapolate, with_blocks
from trainwise.trace.step_trace import StepTrace, trace_training_step


def one_device_estimate(spec: ModelSpec, plan: Plan, device: Device, reshape=None,
                        profile: DeviceProfile | None = None, chunks: int = 1) -> EstimateResult:
    """The traced one-device estimate; `reshape` changes each built model first (the
    per-rank estimate's tensor-parallel shapes). With a `profile`, also the step time
    (trainwise/estimate/step_time.py; `chunks`: traced passes per micro-step)."""
    blocks = block_count(spec.config)
    if should_extrapolate(blocks):
        small_n, large_n = TRACED_BLOCKS
        small, large = (_trace(dataclasses.replace(spec, config=with_blocks(spec.config, n)), plan, device, reshape)
                        for n in (small_n, large_n))
        memory, extrapolation = _repeated_blocks(small[0], large[0], blocks, device), "repeated"
        if memory is None:
            memory, extrapolation = extrapolate_dataclass(small[1], large[1], small_n, large_n, blocks), "line"
            # Per-phase compositions are not extrapolated: the per-rank estimate then
            # rescales the overall peak's.
            memory = dataclasses.replace(_at_least_allocated(_peak_from_phases(memory)), phase_at_peak={})
        params = extrapolate_count(small[0].params, large[0].params, small_n, large_n, blocks)
        trainable = extrapolate_count(small[0].trainable_params, large[0].trainable_params, small_n, large_n, blocks)
        trace, notes, traced = large[0], large[2], (small_n, large_n)
        time = predict_step_time([small[0], large[0]], traced, blocks, plan, device, profile, spec.name, chunks)
    else:
        trace, memory, notes = _trace(spec, plan, device, reshape)
        params, trainable, traced, extrapolation = trace.params, trace.trainable_params, None, None
        time = predict_step_time([trace], None, blocks, plan, device, profile, spec.name, chunks)
    return EstimateResult(model=spec.name, task=spec.task, params=params, trainable_params=trainable,
                          device=device, plan=plan, memory=memory,
                          activations_by_module=_activations_by_module(trace), traced_blocks=traced,
                          total_blocks=blocks, notes=tuple(notes), extrapolation=extrapolation, time=time)


def extrapolate_count(small: int, large: int, small_n: int, large_n: int, target: int) -> int:
    """A parameter count at `target` blocks from the counts at `small_n` and `large_n`
    (each block adds the same whole number of parameters)."""
    return large + (large - small) // (large_n - small_n) * (target - large_n)


def _trace(spec: ModelSpec, plan: Plan, device: Device,
           reshape=None) -> tuple[StepTrace, MemoryEstimate, tuple[str, ...]]:
    built = build_model_with_notes(spec, "meta", attention=plan.attention,
                                   batch_size=plan.batch_size, seq_len=plan.seq_len)
    if reshape is not None:
        reshape(built.model)
    batch_fn = lambda: example_batch(spec, plan.batch_size, plan.seq_len, device="cpu")  # noqa: E731
    trace = trace_training_step(built.model, batch_fn, plan, device.kind, task=spec.task)
    return trace, memory_from_trace(trace, device), tuple(built.notes)


def _repeated_blocks(small: StepTrace, large: StepTrace, blocks: int, device: Device) -> MemoryEstimate | None:
    """Memory of the full-depth timeline synthesised from the 3-block trace, or None when
    the blocks do not repeat cleanly: shrunk to 2 blocks, the synthesis must reproduce
    the 2-block trace exactly (trainwise/estimate/extrapolate.py)."""
    stacks = extrapolated_stacks(small, large)
    try:
        if not same_timeline(synthesize_trace(large, stacks, TRACED_BLOCKS[0], small), small):
            return None
        full = synthesize_trace(large, stacks, blocks, small)
    except CannotSynthesize:
        return None
    return memory_from_trace(full, device)


def _peak_from_phases(memory: MemoryEstimate) -> MemoryEstimate:
    """The step's peak is the largest of the extrapolated per-phase peaks: with more blocks
    the peak may move to another phase than in the small traces."""
    if not memory.phase_peaks:
        return memory
    phase, peak = max(memory.phase_peaks.items(), key=lambda item: item[1])
    return dataclasses.replace(memory, peak_allocated=peak, peak_phase=phase)


def _at_least_allocated(memory: MemoryEstimate) -> MemoryEstimate:
    """Reserved memory is extrapolated on its own line; it can never be below allocated."""
    if memory.peak_reserved >= memory.peak_allocated:
        return memory
    reserved = memory.peak_allocated
    return dataclasses.replace(memory, peak_reserved=reserved, device_total=reserved + memory.context)


def _activations_by_module(trace: StepTrace) -> dict[str, int]:
    """Saved-activation bytes per module in forward (inputs outside any module as
    "(model inputs)")."""
    totals = Counter()
    for record in trace.records:
        if record.category == "activations" and record.phase == "forward":
            totals[record.module or "(model inputs)"] += record.nbytes
    return dict(totals)
