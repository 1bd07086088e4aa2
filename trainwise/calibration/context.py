"""Calibration of the device memory a process holds outside PyTorch's caching allocator:
the CUDA context and the kernel images a training step loads lazily (cuBLAS, attention,
the optimizer's kernels), which hardware/cuda_overheads.py otherwise estimates.

Read after calibrate's own matmuls, attention and optimizer steps ran (so their kernel
images are loaded, as after a training step): what the process holds on the device minus
what the caching allocator reserved. What the process holds comes from NVML (the
nvidia-ml-py package) where it lists this process, else from the device's used memory
(`torch.cuda.mem_get_info`: total minus free), which also counts any other process on the
GPU; the profile records which."""

from __future__ import annotations

import os

import torch

PER_PROCESS = "NVML: this process's device memory"
WHOLE_DEVICE = "torch.cuda.mem_get_info: the device's used memory (every process on it)"


def measure_context(device: torch.device) -> dict | None:
    """{"bytes", "method", "held", "reserved"} on a GPU; None on the CPU (no context)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    held, method = process_held_bytes(device)
    reserved = torch.cuda.memory_reserved(device)
    if held < reserved:
        raise RuntimeError(f"the device memory read ({held} bytes, {method}) is below what the caching "
                           f"allocator reserved ({reserved} bytes): no context size can be read from it")
    return {"bytes": held - reserved, "method": method, "held": held, "reserved": reserved}


def process_held_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes this process holds on `device`, how it was read)."""
    held = _nvml_process_bytes(device)
    if held is not None:
        return held, PER_PROCESS
    free, total = torch.cuda.mem_get_info(device)
    return total - free, WHOLE_DEVICE


def _nvml_process_bytes(device: torch.device) -> int | None:
    """This process's device memory as NVML lists it; None without nvidia-ml-py, or where
    NVML does not list this process (a container's process ids are not the host's)."""
    try:
        import pynvml
    except ImportError:
        return None
    props = torch.cuda.get_device_properties(device)
    bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory:
                return int(process.usedGpuMemory)
        return None
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
