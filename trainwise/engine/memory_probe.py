"""Measured peak memory of a run, from what the device itself reports.

CUDA: the caching allocator's own peaks (`max_memory_allocated` / `max_memory_reserved`)
and, for the device total, the process's memory as the driver reports it (NVML, what
nvidia-smi shows). CPU: PyTorch's profiler sees every tensor allocation and free of the
CPU allocator; profiling slows a step, so only one step (`probe_step`) is profiled and
the loop leaves it out of the throughput. The profiler cannot see frees of blocks that
existed before it started, so the peak is the bytes of the tensors alive at the step's
start plus the highest running sum of the allocations made inside it. A CPU has no
allocator cache or context to report: those stay None rather than being made up."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Iterable

import torch


@dataclass(frozen=True)
class MeasuredMemory:
    """Bytes, measured; None where this device reports no such figure (yet)."""

    peak_allocated: int | None
    peak_reserved: int | None
    device_total: int | None
    method: str


class MemoryProbe:
    def __init__(self, device: torch.device, probe_step: int):
        self.device, self.probe_step = device, probe_step
        self._profiler = None
        self._baseline = 0
        self._cpu_peak: int | None = None

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def step_begin(self, step: int, live_tensors: Iterable[torch.Tensor] = ()) -> None:
        if self.device.type != "cpu" or step != self.probe_step:
            return
        from torch.profiler import ProfilerActivity, profile

        self._baseline = unique_storage_bytes(live_tensors)
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_stderr():
            self._profiler.__enter__()

    def step_end(self, step: int) -> None:
        if self._profiler is None or step != self.probe_step:
            return
        with _quiet_stderr():
            self._profiler.__exit__(None, None, None)
        events = self._profiler.profiler.kineto_results.events()
        self._cpu_peak = self._baseline + _highest_running_sum(events)
        self._profiler = None

    def snapshot(self) -> MeasuredMemory:
        if self.device.type == "cuda":
            return _cuda_snapshot(self.device)
        return MeasuredMemory(self._cpu_peak, None, None,
                              f"cpu: tensor memory from the PyTorch profiler over step {self.probe_step + 1} "
                              "(+ tensors live at its start); no allocator cache or context on cpu")


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


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views and tied weights once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _highest_running_sum(events) -> int:
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, delta in deltas:
        live += delta
        peak = max(peak, live)
    return peak


def _cuda_snapshot(device: torch.device) -> MeasuredMemory:
    allocated = torch.cuda.max_memory_allocated(device)
    reserved = torch.cuda.max_memory_reserved(device)
    total = _nvml_process_bytes(device)
    how = "cuda: torch.cuda.max_memory_allocated/reserved"
    if total is None:
        return MeasuredMemory(allocated, reserved, None, how + "; device total unavailable (NVML could not read it)")
    return MeasuredMemory(allocated, reserved, total, how + "; device total from NVML for this process (now)")


def _nvml_process_bytes(device: torch.device) -> int | None:
    """GPU memory the driver attributes to this process, as nvidia-smi lists it."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            index = device.index if device.index is not None else torch.cuda.current_device()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == os.getpid() and process.usedGpuMemory:
                    return int(process.usedGpuMemory)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, containers hiding pids: report unavailable
        return None
    return None
