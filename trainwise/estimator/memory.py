"""From a StepTrace and a Device to the memory figures users see (bytes, one device)."""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field

from trainwise.estimator.anatomy import replay
from trainwise.estimator.caching_allocator import AllocatorStats, CachingAllocatorModel, round_block_size
from trainwise.hardware import Device
from trainwise.trace.step_trace_data import StepTrace
from trainwise.trace.storage import ALLOC, OFFLOADED_OP

# cuBLAS keeps one workspace per (handle, stream); a handle is per thread, and autograd runs
# CUDA backward on its own device thread, so a training step holds two.
CUBLAS_HANDLES_PER_STEP = 2

MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "temporary", "context",
               "peak_allocated", "peak_reserved", "device_total")


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted memory of one training step on one device, in bytes.

    weights/buffers/gradients/optimizer: held in steady state; activations: saved for
    backward at the end of one micro-batch's forward; temporary: other tensors alive at the
    peak; workspace: cuBLAS workspaces; context: device memory outside PyTorch's allocator
    (CUDA context, kernels; a catalog figure); peak_allocated / peak_reserved: what
    torch.cuda.max_memory_allocated / max_memory_reserved would report; device_total: what
    nvidia-smi would show for the process."""

    weights: int
    buffers: int
    gradients: int
    optimizer: int
    activations: int
    temporary: int
    workspace: int
    context: int
    peak_allocated: int
    peak_reserved: int
    device_total: int
    peak_phase: str
    peak_module: str
    at_peak: dict[str, int] = field(default_factory=dict)
    # Peak allocated bytes within each phase of the step (forward, backward, optimizer...).
    # When block extrapolation falls back to a line, it takes the largest of the
    # extrapolated phase peaks, as the phase holding the peak can change with depth.
    phase_peaks: dict[str, int] = field(default_factory=dict)
    # Under a parallel layout (trainwise/estimator/per_rank.py): communication buffers on
    # the device at the peak, and model states moved to host memory by --cpu-offload.
    # One device: the saved tensors --activation-offload keeps in host memory at most.
    communication: int = 0
    host: int = 0
    # Live bytes per category at each phase's own peak (the per-rank estimate rescales them).
    phase_at_peak: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict:
        data = {key: getattr(self, key) for key in MEMORY_KEYS}
        data.update(buffers=self.buffers, workspace=self.workspace, peak_phase=self.peak_phase,
                    at_peak=dict(self.at_peak))
        if self.communication or self.host:
            data.update(communication=self.communication, host=self.host)
        return data


def memory_from_trace(trace: StepTrace, device: Device) -> MemoryEstimate:
    """Apply the device's allocator and fixed overheads to the traced step."""
    host = offloaded_activation_peak(trace)
    if device.is_cuda:
        trace = _device_resident(trace)
        workspace = CUBLAS_HANDLES_PER_STEP * device.cublas_workspace_bytes
        extra = [("workspace", device.cublas_workspace_bytes)] * CUBLAS_HANDLES_PER_STEP
        anatomy = replay(trace, round_block_size, extra)
        # The allocator books whole blocks: an unsplit remainder of a cached block counts as
        # allocated too, so its peak is the one max_memory_allocated() reports.
        phase_peaks, stats = _allocator_phase_peaks(trace, extra)
        peak_allocated, peak_reserved = stats.peak_allocated, stats.peak_reserved
    else:
        # The CPU allocator hands out exactly what is asked and caches nothing.
        workspace, anatomy = 0, replay(trace)
        peak_allocated = peak_reserved = anatomy.peak_allocated
        phase_peaks = _exact_phase_peaks(trace)
    context = device.context_bytes
    totals = anatomy.totals
    return MemoryEstimate(
        weights=totals["weights"], buffers=totals["buffers"], gradients=totals["gradients"],
        optimizer=totals["optimizer"], activations=totals["activations"], temporary=totals["temporary"],
        workspace=workspace, context=context, peak_allocated=peak_allocated,
        peak_reserved=peak_reserved, device_total=peak_reserved + context,
        peak_phase=anatomy.peak_phase, peak_module=anatomy.peak_module, at_peak=anatomy.at_peak,
        phase_peaks=phase_peaks, phase_at_peak=anatomy.phase_at_peak, host=host)


def offloaded_activation_peak(trace: StepTrace) -> int:
    """Most bytes of --activation-offload's host copies alive at once in the measured step
    (host memory, 0 without them): one micro-batch's offloaded saved tensors."""
    live = peak = 0
    for index, (kind, key) in enumerate(trace.events):
        record = trace.records[key]
        if record.op == OFFLOADED_OP:
            live += record.nbytes if kind == ALLOC else -record.nbytes
            if index >= trace.window_start:
                peak = max(peak, live)
    return peak


def _phase_slices(trace: StepTrace):
    """(phase, first event, end event) for each phase inside the measured window."""
    starts = [(name, start) for name, start in trace.phase_starts if start >= trace.window_start]
    ends = [start for _, start in starts[1:]] + [len(trace.events)]
    return [(name, start, end) for (name, start), end in zip(starts, ends)]


def _device_resident(trace: StepTrace) -> StepTrace:
    """The trace without the storages a GPU step keeps in host memory (see
    StorageRecord.host_resident): their events are dropped (event indices shift to match)
    and their category becomes "host", which no device figure counts."""
    records = trace.records
    dropped = [i for i, (_, key) in enumerate(trace.events) if records[key].host_resident]
    if not dropped:
        return trace
    gone = set(dropped)

    def moved(index: int) -> int:
        return index - bisect.bisect_left(dropped, index)

    return dataclasses.replace(
        trace, events=[e for i, e in enumerate(trace.events) if i not in gone],
        event_blocks=[b for i, b in enumerate(trace.event_blocks) if i not in gone],
        records=[dataclasses.replace(r, category="host") if r.host_resident else r for r in records],
        window_start=moved(trace.window_start),
        phase_starts=[(name, moved(start)) for name, start in trace.phase_starts])


def _allocator_phase_peaks(trace: StepTrace, extra):
    """Peak allocated per phase from the caching-allocator model, and its stats for the
    whole trace (one pass)."""
    events = _allocator_events(trace, extra)
    offset = len(extra)  # the workspace allocations come first
    model = CachingAllocatorModel()
    model.simulate(events[:offset + trace.window_start])
    overall = model.peak_allocated
    peaks: dict[str, int] = {}
    for name, start, end in _phase_slices(trace):
        model.peak_allocated = model.allocated  # like torch.cuda.reset_peak_memory_stats()
        model.simulate(events[offset + start:offset + end])
        peaks[name] = max(peaks.get(name, 0), model.peak_allocated)
        overall = max(overall, model.peak_allocated)
    stats = AllocatorStats(peak_allocated=overall, peak_reserved=model.peak_reserved, allocated=model.allocated,
                           reserved=model.reserved, segments=model.segments)
    return peaks, stats


def _exact_phase_peaks(trace: StepTrace) -> dict[str, int]:
    """Peak live bytes per phase (the CPU allocator adds nothing)."""
    live = 0
    peaks: dict[str, int] = {}
    bounds = {start: name for name, start, _ in _phase_slices(trace)}
    phase = None
    for index, (kind, key) in enumerate(trace.events):
        phase = bounds.get(index, phase)
        live += trace.records[key].nbytes if kind == ALLOC else -trace.records[key].nbytes
        if phase is not None and index >= trace.window_start:
            peaks[phase] = max(peaks.get(phase, 0), live)
    return peaks


def _allocator_events(trace: StepTrace, extra):
    """The trace's events as (alloc|free, key, nbytes) for the caching-allocator model."""
    offset = len(trace.records)
    events = [("alloc", offset + i, nbytes) for i, (_, nbytes) in enumerate(extra)]
    events += [("alloc" if kind == ALLOC else "free", key, trace.records[key].nbytes) for kind, key in trace.events]
    return events
