"""Measured peak memory of a run, from what the device itself reports.

CUDA: the caching allocator's own peaks (`max_memory_allocated` / `max_memory_reserved`
since `reset()`) and, for the device total, the peak reserved plus what the process holds
outside the allocator (CUDA context, kernel images, library handles), read from the
driver (NVML, what nvidia-smi shows) or, where NVML cannot see the process, estimated
from the GPU's SM count and said so in `method`.

CPU: PyTorch's profiler sees every tensor allocation and free of the CPU allocator.
Profiling slows a step, so only one step (`probe_step`) is profiled, and the loop leaves
that step out of the throughput summary. The profiler cannot see frees of blocks that
existed before it started, so the peak is the bytes of the tensors alive at the step's
start (weights, buffers, optimizer state, any gradients) plus the highest running sum of
the allocations and frees made inside the step. A CPU has no allocator cache or context
to report: those stay None rather than being made up. Memory that BLAS/oneDNN take from
malloc directly is not tensor memory and is not seen (as on a GPU)."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Iterable

import torch

from trainwise.engine.memory_nvml import ProcessGpuMemory
from trainwise.hardware.cuda_overheads import estimate_context_bytes


@dataclass(frozen=True)
class MeasuredMemory:
    """Bytes, measured; None where this device reports no such figure (yet). `method`
    says how each figure was obtained."""

    peak_allocated: int | None
    peak_reserved: int | None
    device_total: int | None
    method: str


class MemoryProbe:
    """Peak memory of a run on `device`. Call `reset()` before the first step, and
    `step_begin(step, live_tensors)` / `step_end(step)` around every step (steps count
    from 0); only `probe_step` does any work, and only on the CPU."""

    def __init__(self, device: torch.device, probe_step: int):
        self.device, self.probe_step = torch.device(device), probe_step
        self._profiler = None
        self._baseline = 0
        self._cpu_peak: int | None = None
        self._nvml: ProcessGpuMemory | None = None

    def reset(self) -> None:
        """Start the peaks afresh (CUDA: the allocator's peak counters)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._cpu_peak = None

    def step_begin(self, step: int, live_tensors: Iterable[torch.Tensor] = ()) -> None:
        """On the CPU probe step: note the bytes of `live_tensors` (everything alive now
        that the step may free or keep) and start the profiler. Otherwise nothing."""
        if self.device.type != "cpu" or step != self.probe_step or self._profiler is not None:
            return
        from torch.profiler import ProfilerActivity, profile

        self._baseline = unique_storage_bytes(live_tensors)
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        # PyTorch's CPU allocator logs "Memory block of unknown size was allocated before the
        # profiling started" (C++, on fd 2) at the first free of a block older than the
        # profiler, then once per 1000 such frees: that first one is spent here, unheard, on
        # a block made for it. (The peak counts those blocks already: live_tensors.)
        spent = torch.empty(16)
        with _quiet_stderr():
            self._profiler.__enter__()
            del spent

    def step_end(self, step: int) -> None:
        """On the CPU probe step: stop the profiler and compute the step's peak."""
        if self._profiler is None or step != self.probe_step:
            return
        profiler, self._profiler = self._profiler, None
        with _quiet_stderr():
            profiler.__exit__(None, None, None)
        self._cpu_peak = self._baseline + highest_running_sum(profiler.profiler.kineto_results.events())

    def snapshot(self) -> MeasuredMemory:
        """The peaks so far (CPU: None until the probe step has ended)."""
        if self.device.type == "cuda":
            if self._nvml is None:
                self._nvml = ProcessGpuMemory(self.device)
            return _cuda_snapshot(self.device, self._nvml.used_bytes())
        return MeasuredMemory(self._cpu_peak, None, None,
                              f"cpu: tensor memory from the PyTorch profiler over step {self.probe_step + 1} "
                              "(+ tensors live at its start); no allocator cache or context on cpu")


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views and tied weights once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def highest_running_sum(events) -> int:
    """The largest total of the profiler's "[memory]" deltas (+ alloc, - free) at any moment."""
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, delta in deltas:
        live += delta
        peak = max(peak, live)
    return peak


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ backend prints start/stop lines on file descriptor 2; they mean
    nothing to a user watching a training run."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cuda_snapshot(device: torch.device, process_bytes: int | None) -> MeasuredMemory:
    """The allocator's peaks since reset(), and what nvidia-smi would have shown at the
    reserved peak: the peak reserved plus the memory this process holds outside the caching
    allocator. `process_bytes` is NVML's figure for this process now (None: unknown)."""
    allocated = torch.cuda.max_memory_allocated(device)
    reserved = torch.cuda.max_memory_reserved(device)
    how = "cuda: torch.cuda.max_memory_allocated/max_memory_reserved since the run started"
    if process_bytes is not None:
        outside = max(0, process_bytes - torch.cuda.memory_reserved(device))
        return MeasuredMemory(allocated, reserved, reserved + outside,
                              how + "; device_total = peak reserved + memory outside the allocator "
                              "(NVML's figure for this process minus what the allocator reserves now)")
    props = torch.cuda.get_device_properties(device)
    context = estimate_context_bytes(props.multi_processor_count, props.max_threads_per_multi_processor)
    return MeasuredMemory(allocated, reserved, reserved + context,
                          how + f"; device_total = peak reserved + an estimated {context / 2**20:.0f} MiB CUDA "
                          "context (NVML does not list this process: no pynvml, or a container hides its pid)")
