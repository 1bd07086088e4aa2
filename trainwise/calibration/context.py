"""Calibration of the device memory a process holds outside PyTorch's caching allocator:
the CUDA context and the kernel images a training step loads lazily (cuBLAS, attention,
the optimizer's kernels), which hardware/cuda_overheads.py otherwise estimates.

Read after calibrate's own matmuls, attention and optimizer steps ran (so their kernel
images are loaded, as after a training step): what the process holds on the device minus
what the caching allocator reserved. What the process holds comes from NVML (the
nvidia-ml-py package, read as the training loop's memory probe reads it:
engine/memory_nvml.py) where it lists this process (a container's process ids are not the
host's), else from the device's used memory (`torch.cuda.mem_get_info`: total minus
free), which also counts any other process on the GPU; the profile records which."""

from __future__ import annotations

import torch

from trainwise.engine.memory_nvml import ProcessGpuMemory

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
    held = ProcessGpuMemory(device).used_bytes()
    if held is not None:
        return held, PER_PROCESS
    free, total = torch.cuda.mem_get_info(device)
    return total - free, WHOLE_DEVICE
