"""`trainwise.api.environment()`: what this machine offers for training, read, not assumed.

GPUs (name, memory, compute capability, bf16/TF32 support, catalog match), how each pair
is linked (NVLink count or PCIe path), CUDA / cuDNN / NCCL / torch versions, CPU cores
and memory, and which optional packages are installed. On a machine without a GPU the
GPU list is empty and `gpu_note` says why.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import asdict, dataclass, field

import torch

from trainwise.hardware.detect import gpu_from_detected, read_cuda_devices
from trainwise.hardware.topology import read_links

# Packages that change what trainwise can do, and what for.
OPTIONAL_PACKAGES = {
    "flash-attn": "--attention flash",
    "bitsandbytes": "--optim adamw-8bit",
    "liger-kernel": "--kernels liger",
    "torchao": "--float8",
    "deepspeed": "not used by trainwise (listed for comparison)",
    "apex": "not used by trainwise (listed for comparison)",
    "peft": "--lora-rank",
    "triton": "--compile on a GPU",
    "nvidia-ml-py": "device memory as nvidia-smi shows it; GPU links",
    "transformers": "the models",
    "accelerate": "the Trainer baseline of bench",
}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_bytes: int  # total, as nvidia-smi shows it when NVML is present
    compute_capability: str
    bf16: bool  # native bf16 math (Ampere, compute capability 8.0, and newer)
    tf32: bool  # TF32 tensor cores (Ampere and newer)
    catalog: str | None  # the hardware catalog entry it matches (peak FLOP/s for MFU)
    pci_bus_id: str | None


@dataclass(frozen=True)
class Environment:
    python: str
    torch: str
    cuda: str | None  # the CUDA version torch was built with
    cudnn: str | None
    nccl: str | None
    distributed_backends: list[str]
    cpu_cores: int
    host_memory_bytes: int | None
    gpus: list[GpuInfo]
    gpu_note: str | None  # why there are no GPUs, when there are none
    links: list[list[str | None]] | None  # links[i][j]: "NV4", "PIX", ... ; None: unknown
    packages: dict[str, str | None] = field(default_factory=dict)  # name -> version, None: absent

    def to_json(self) -> dict:
        return asdict(self)


def environment() -> Environment:
    gpus = _gpus()
    links = read_links([g.pci_bus_id for g in gpus]) if len(gpus) > 1 and all(g.pci_bus_id for g in gpus) else None
    return Environment(
        python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
        cudnn=_cudnn(), nccl=_nccl(), distributed_backends=_backends(), cpu_cores=_cpu_cores(),
        host_memory_bytes=_host_memory(), gpus=gpus, gpu_note=None if gpus else _why_no_gpu(),
        links=[[link.label if link else None for link in row] for row in links] if links else None,
        packages={name: _version(name) for name in OPTIONAL_PACKAGES})


def _gpus() -> list[GpuInfo]:
    found = []
    for detected in read_cuda_devices():
        gpu = gpu_from_detected(detected)
        major, minor = detected.compute_capability
        found.append(GpuInfo(
            index=detected.index, name=detected.name, memory_bytes=detected.memory_bytes,
            compute_capability=f"{major}.{minor}", bf16=major >= 8, tf32=major >= 8,
            catalog=gpu.name if gpu.source == "detected" else None, pci_bus_id=_bus_id(detected.index)))
    return found


def _bus_id(index: int) -> str | None:
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"


def _why_no_gpu() -> str:
    if torch.version.cuda is None:
        return f"no GPU: this torch ({torch.__version__}) is a CPU-only build"
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return "no GPU: CUDA_VISIBLE_DEVICES is empty"
    return "no GPU: torch finds no CUDA device (no NVIDIA driver, or no GPU in this machine)"


def _cudnn() -> str | None:
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return str(version) if version else None


def _nccl() -> str | None:
    if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _backends() -> list[str]:
    import torch.distributed as dist

    if not dist.is_available():
        return []
    checks = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available}
    return [name for name, available in checks.items() if available()]


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
