"""GPU memory the driver attributes to this process, as nvidia-smi lists it (via NVML).

The session is opened once per probe and kept: the loop reads memory after every step,
and initialising NVML each time would cost milliseconds per step. NVML's initialisation
is reference-counted, so a session left open until the process exits disturbs nothing."""

from __future__ import annotations

import os

import torch

from trainwise.hardware.detect import _nvml_handle


class ProcessGpuMemory:
    """Reads this process's used memory on one CUDA device; `used_bytes()` is None when
    NVML cannot say (no pynvml or driver library, no per-process accounting, or a
    container whose pid namespace hides this process from the driver)."""

    def __init__(self, device: torch.device):
        self._pynvml, self._handle = _open(device)

    def used_bytes(self) -> int | None:
        if self._handle is None:
            return None
        try:
            processes = self._pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:  # noqa: BLE001 - NVML without per-process accounting
            return None
        for process in processes:
            if process.pid == os.getpid() and process.usedGpuMemory:
                return int(process.usedGpuMemory)
        return None


def _open(device: torch.device):
    try:
        import pynvml
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver library
        return None, None
    try:
        # CUDA and NVML number devices differently; match by PCI address or UUID.
        handle = _nvml_handle(pynvml, torch.cuda.get_device_properties(device))
    except Exception:  # noqa: BLE001
        handle = None
    if handle is None:
        _shutdown(pynvml)
        return None, None
    return pynvml, handle


def _shutdown(pynvml) -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass
