"""Detect the GPUs of this machine and match them to the catalog.

torch.cuda gives name, capability, SM count and memory; when nvidia-ml-py (pynvml) is
importable we take the memory total from NVML instead, because that is the figure
nvidia-smi shows. Nothing here creates a CUDA context: device properties are read
without one.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from trainwise.hardware.catalog import catalog
from trainwise.hardware.cuda_overheads import cublas_workspace_bytes, estimate_context_bytes
from trainwise.hardware.device import Device, detected_device
from trainwise.hardware.gpu import GPU, PeakFlops

# A detected board matches a catalog entry only if its memory is this close (relative):
# same-named boards with other memory (H100 NVL 94 GB, A100 40 vs 80 GB) stay apart.
_MEMORY_TOLERANCE = 0.06

# Words in CUDA device names that say nothing about the model.
_NOISE_WORDS = ("NVIDIA", "TESLA", "GEFORCE", "QUADRO")


@dataclass(frozen=True)
class DetectedGPU:
    """What the driver says about one device."""

    index: int
    name: str  # as CUDA reports it, e.g. "NVIDIA A100-SXM4-80GB"
    memory_bytes: int
    compute_capability: tuple[int, int]
    sm_count: int | None = None
    max_threads_per_sm: int | None = None


def _model_words(name: str) -> set[str]:
    words = re.split(r"[\s_\-]+", name.upper())
    return {w for w in words if w and w not in _NOISE_WORDS}


def _family_words(gpu: GPU) -> set[str]:
    """Words a detected name must contain to be this catalog GPU, e.g. {"H100", "PCIE"}."""
    words = _model_words(gpu.name)
    # "80GB"-style words are checked by memory, not by name: CUDA names often omit them.
    return {w for w in words if not re.fullmatch(r"\d+GB", w)}


def match_catalog(device_name: str, memory_bytes: int) -> GPU | None:
    """The catalog GPU a detected device is, or None when no entry fits name and memory.

    Among entries whose family words all occur in the device name (RTX-3090 needs "3090";
    H100-PCIe needs "H100" and "PCIE"), the most specific one whose memory lies within a
    few percent of the detected total wins.
    """
    words = _model_words(device_name)
    best: tuple[int, float, GPU] | None = None
    for gpu in catalog():
        family = _family_words(gpu)
        if not family <= words:
            continue
        gap = abs(memory_bytes - gpu.memory_bytes) / gpu.memory_bytes
        if gap > _MEMORY_TOLERANCE:
            continue
        candidate = (len(family), -gap, gpu)
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    return best[2] if best else None


def gpu_from_detected(found: DetectedGPU) -> GPU:
    """A GPU for a detected device: the catalog entry if it matches, else what we can read.

    A catalog match keeps the catalog's rates but takes this board's exact memory total.
    An unknown board gets its memory and capability, estimated overheads, and no peaks.
    """
    known = match_catalog(found.name, found.memory_bytes)
    if known is not None:
        return dataclasses.replace(known, memory_bytes=found.memory_bytes, source="detected")
    sms = found.sm_count or 0
    threads = found.max_threads_per_sm or 2048
    return GPU(
        name=found.name,
        memory_bytes=found.memory_bytes,
        context_bytes=estimate_context_bytes(sms, threads),
        cublas_workspace_bytes=cublas_workspace_bytes(found.compute_capability),
        compute_capability=found.compute_capability,
        peak_flops=PeakFlops(),
        memory_bandwidth=None,
        interconnect=None,
        sm_count=found.sm_count,
        max_threads_per_sm=found.max_threads_per_sm,
        source="detected (not in catalog: no peak rates)",
    )


def _nvml_memory_totals(props_by_index: dict[int, object]) -> dict[int, int]:
    """index -> NVML memory total in bytes, for the devices NVML can find; {} without pynvml."""
    try:
        import pynvml  # optional: nvidia-ml-py
    except ImportError:
        return {}
    totals: dict[int, int] = {}
    try:
        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        for index, props in props_by_index.items():
            try:
                handle = _nvml_handle(pynvml, props)
                if handle is not None:
                    totals[index] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except Exception:
                continue  # fall back to torch's figure for this device
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return totals


def _nvml_handle(pynvml, props):
    # CUDA and NVML number devices differently (CUDA_VISIBLE_DEVICES, FASTEST_FIRST), so
    # match by PCI address or UUID, never by index.
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain = getattr(props, "pci_domain_id", 0)
        device = getattr(props, "pci_device_id", 0)
        try:
            address = f"{domain:08X}:{bus:02X}:{device:02X}.0"
            return pynvml.nvmlDeviceGetHandleByPciBusId(address)
        except Exception:
            pass
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        try:
            uuid_text = text if text.startswith("GPU-") else f"GPU-{text}"
            return pynvml.nvmlDeviceGetHandleByUUID(uuid_text)
        except Exception:
            pass
    return None


def read_cuda_devices() -> list[DetectedGPU]:
    """What the driver reports for each CUDA device torch can see, in torch's order."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    props_by_index = {index: torch.cuda.get_device_properties(index)
                      for index in range(torch.cuda.device_count())}
    nvml_totals = _nvml_memory_totals(props_by_index)
    found = []
    for index, props in props_by_index.items():
        found.append(DetectedGPU(
            index=index,
            name=props.name,
            memory_bytes=nvml_totals.get(index, int(props.total_memory)),
            compute_capability=(int(props.major), int(props.minor)),
            sm_count=getattr(props, "multi_processor_count", None),
            max_threads_per_sm=getattr(props, "max_threads_per_multi_processor", None),
        ))
    return found


def detect_gpus() -> list[Device]:
    """This machine's CUDA devices as Devices (source "detected"), in torch's order.

    Empty without CUDA. Each carries the catalog entry it matches (with this board's
    exact memory total) or, for a GPU the catalog lacks, the figures that can be read.
    """
    return [detected_device(gpu_from_detected(found), found.index) for found in read_cuda_devices()]


def catalog_gpu_present(name: str) -> bool:
    """Whether this machine has a GPU of the catalog name `name` (the check `plan --verify`
    and `train --device NAME` share: both run on the GPU that is here)."""
    return any(found.name == name for found in detect_gpus())
