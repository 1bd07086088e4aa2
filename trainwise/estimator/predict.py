"""The one-device estimate: trace the step on fake tensors and read its memory.

A model with more than a few identical blocks is traced at 2 and 3 blocks
(trainwise/trace/depth.py) and read at full depth: the 3-block timeline repeated and
replayed where the blocks repeat cleanly, else a line through the two traces' figures
(trainwise/estimator/extrapolate.py). Blocks that differ by design (Gemma's sliding and
full attention layers...) are traced at one more depth per extra layer kind and each
figure is read per kind (trainwise/trace/layer_pattern.py, `depth_fit`). The per-rank
estimate (layout_estimate.py) runs this on each rank's workload."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from trainwise.estimator.extrapolate import (CannotSynthesize, extrapolate_dataclass, extrapolated_stacks,
                                             same_timeline, synthesize_trace)
from trainwise.estimator.memory import MemoryEstimate, memory_from_trace
from trainwise.estimator.result import EstimateResult
from trainwise.estimator.shared_traces import SharedTraces
from trainwise.estimator.step_time import price_step
from trainwise.estimator.step_work import step_work
from trainwise.hardware import Device
from trainwise.hardware.profile import DeviceProfile
from trainwise.models import ModelSpec, build_model_with_notes, example_batch
from trainwise.plan.plan import Plan
from trainwise.trace.depth import (TRACED_BLOCKS, DepthFit, block_count, checkpoint_every, depth_fit,
                                   extrapolate_by_kind, with_blocks)
from trainwise.trace.step_trace import trace_training_step
from trainwise.trace.step_trace_data import StepTrace, priced_as


@dataclass(frozen=True)
class TracedStep:
    """A plan's step traced and read at full depth, before its time is priced: what a plan
    and its --compile twin share. `traces`: one per traced depth (`fit.depths`), or the
    whole model's when `fit` is None; `notes`: the model build's."""

    traces: tuple[StepTrace, ...]
    fit: DepthFit | None
    memory: MemoryEstimate
    extrapolation: str | None
    params: int
    trainable_params: int
    activations_by_module: dict[str, int]
    notes: tuple[str, ...]


def one_device_estimate(spec: ModelSpec, plan: Plan, device: Device, reshape=None,
                        profile: DeviceProfile | None = None, chunks: int = 1,
                        shared: SharedTraces | None = None) -> EstimateResult:
    """The traced one-device estimate; `reshape` changes each built model first (the
    per-rank estimate's tensor-parallel shapes). With a `profile`, also the step time
    (trainwise/estimator/step_time.py; `chunks`: traced passes per micro-step). `shared`:
    steps traced by earlier estimates of the same search, of which the plan's compile twin
    may be one (trainwise/estimator/shared_traces.py); not with `reshape`."""
    if shared is not None and reshape is None:
        step = shared.step(spec, plan, device, lambda: traced_step(spec, plan, device, compiled_pricing=True))
    else:
        step = traced_step(spec, plan, device, reshape)
    traces = [priced_as(trace, plan.compile) for trace in step.traces]
    work = step_work(traces, step.fit, plan)
    time = price_step(work, plan, device, profile, spec.name, chunks) if profile is not None else None
    fit = step.fit
    return EstimateResult(model=spec.name, task=spec.task, params=step.params, trainable_params=step.trainable_params,
                          device=device, plan=plan, memory=step.memory,
                          activations_by_module=step.activations_by_module,
                          traced_blocks=fit.depths if fit else None,
                          total_blocks=fit.target if fit else block_count(spec.config), notes=step.notes,
                          extrapolation=step.extrapolation, time=time, work=work)


def traced_step(spec: ModelSpec, plan: Plan, device: Device, reshape=None, *,
                compiled_pricing: bool = False) -> TracedStep:
    """Trace `plan`'s step (2-3 blocks and read at full depth, or the whole model) and read
    its memory. `compiled_pricing`: price the ops as compiled too (trace_training_step)."""
    fit = depth_fit(spec.config, checkpoint_every(plan))
    if fit is None:
        trace, notes = _traced(spec, plan, device, reshape, compiled_pricing)
        return TracedStep((trace,), None, memory_from_trace(trace, device), None, trace.params,
                          trace.trainable_params, _activations_by_module(trace), notes)
    traced = [_traced(dataclasses.replace(spec, config=with_blocks(spec.config, n)), plan, device, reshape,
                      compiled_pricing) for n in fit.depths]
    traces = tuple(trace for trace, _ in traced)
    memory, extrapolation = _extrapolated_memory(traces, fit, device)
    large = fit.depths.index(TRACED_BLOCKS[1])
    return TracedStep(traces, fit, memory, extrapolation, extrapolate_by_kind([t.params for t in traces], fit),
                      extrapolate_by_kind([t.trainable_params for t in traces], fit),
                      _activations_by_module(traces[large]), traced[large][1])


def _extrapolated_memory(traces: Sequence[StepTrace], fit: DepthFit, device: Device) -> tuple[MemoryEstimate, str]:
    """Memory at full depth from the traces at `fit.depths`: the 3-block timeline repeated
    where the blocks repeat cleanly, else a line through 2 and 3 blocks ("line"), or each
    figure read per layer kind where blocks differ by design ("per-kind")."""
    if fit.uniform:
        memory = _repeated_blocks(traces[0], traces[1], fit.target, device)
        if memory is not None:
            return memory, "repeated"
    # Each depth's own figures, read only here: the repeated timeline above needs none of them.
    per_depth = [memory_from_trace(trace, device) for trace in traces]
    memory = _at_least_allocated(_peak_from_phases(extrapolate_dataclass(per_depth, fit)))
    # Per-phase compositions are not kept (the per-rank estimate then rescales the overall
    # peak's), but the peak's is read from its phase's: with depth the peak can move to
    # another phase than the traced depths had it in (from backward to the optimizer step).
    at_peak = memory.phase_at_peak.get(memory.peak_phase)
    if at_peak:
        memory = dataclasses.replace(memory, at_peak=at_peak, temporary=at_peak.get("temporary", 0))
    if not fit.uniform and device.is_cuda:
        memory = _reserved_of_repeated_blocks(memory, traces, fit, device)
    return dataclasses.replace(memory, phase_at_peak={}), "line" if fit.uniform else "per-kind"


def _reserved_of_repeated_blocks(memory: MemoryEstimate, traces: Sequence[StepTrace], fit: DepthFit,
                                 device: Device) -> MemoryEstimate:
    """Peak reserved where blocks differ by design: what the caching allocator keeps is not
    a line in depth (which cached block serves a request), so it is taken from the
    3-block timeline written out at full depth as if every block were of block 1's kind,
    plus the bytes by which the per-kind peak allocated differs from that timeline's."""
    repeated = _repeated_blocks(traces[0], traces[1], fit.target, device)
    if repeated is None:
        return memory
    reserved = max(repeated.peak_reserved + memory.peak_allocated - repeated.peak_allocated, memory.peak_allocated)
    return dataclasses.replace(memory, peak_reserved=reserved, device_total=reserved + memory.context)


def extrapolate_count(small: int, large: int, small_n: int, large_n: int, target: int) -> int:
    """A parameter count at `target` blocks from the counts at `small_n` and `large_n`
    (each block adds the same whole number of parameters)."""
    return large + (large - small) // (large_n - small_n) * (target - large_n)


def _trace(spec: ModelSpec, plan: Plan, device: Device,
           reshape=None) -> tuple[StepTrace, MemoryEstimate, tuple[str, ...]]:
    """One trace of `spec` as built (its depth as given), its own memory and the build notes."""
    trace, notes = _traced(spec, plan, device, reshape)
    return trace, memory_from_trace(trace, device), notes


def _traced(spec: ModelSpec, plan: Plan, device: Device, reshape=None,
            compiled_pricing: bool = False) -> tuple[StepTrace, tuple[str, ...]]:
    built = build_model_with_notes(spec, "meta", attention=plan.attention,
                                   batch_size=plan.batch_size, seq_len=plan.seq_len)
    if reshape is not None:
        reshape(built.model)
    documents = plan.packing == "documents"  # rows of packed documents carry position_ids, no mask
    batch_fn = lambda: example_batch(spec, plan.batch_size, plan.seq_len, "cpu", documents=documents)  # noqa: E731
    trace = trace_training_step(built.model, batch_fn, plan, device.kind, task=spec.task,
                                compiled_pricing=compiled_pricing)
    return trace, tuple(built.notes)


def _repeated_blocks(small: StepTrace, large: StepTrace, blocks: int, device: Device) -> MemoryEstimate | None:
    """Memory of the full-depth timeline synthesised from the 3-block trace, or None when
    the blocks do not repeat cleanly: shrunk to 2 blocks, the synthesis must reproduce
    the 2-block trace exactly (trainwise/estimator/extrapolate.py)."""
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
