"""Device: the machine a plan targets (the CPU, a detected GPU, a catalog GPU, or generic CUDA)."""

from __future__ import annotations

from dataclasses import dataclass

from trainwise.hardware.cuda_overheads import (
    LARGE_CUBLAS_WORKSPACE_BYTES,
    estimate_context_bytes,
)
from trainwise.hardware.gpu import GPU

# "cuda" on a machine without a GPU: we can still trace and estimate for CUDA, but we do
# not know the capacity. Overheads are taken from a current data-centre GPU (Hopper:
# 132 SMs x 2048 threads, 32 MiB cuBLAS workspace) and the device says so in its name.
GENERIC_CUDA_CONTEXT_BYTES = estimate_context_bytes(132, 2048)
GENERIC_CUDA_CUBLAS_WORKSPACE_BYTES = LARGE_CUBLAS_WORKSPACE_BYTES
GENERIC_CUDA_NAME = ("cuda (generic: no GPU detected, capacity unknown, "
                     "Hopper-class overheads assumed)")

SOURCES = ("catalog", "detected", "generic")


@dataclass(frozen=True)
class Device:
    """What a plan runs on.

    kind: "cpu" or "cuda" (the device type tensors are traced on).
    gpu: the GPU's figures; None for the CPU and for generic CUDA.
    source: "catalog" (named by the user), "detected" (this machine's GPU) or
        "generic" (CUDA without a known GPU); for the CPU, "generic".
    name: for display.
    index: the CUDA ordinal of a detected GPU, else None.
    measured_context_bytes: the device memory outside the caching allocator as a profile
        of this GPU measured it (trainwise calibrate); None: estimated (cuda_overheads.py).
    """

    kind: str
    name: str
    source: str
    gpu: GPU | None = None
    index: int | None = None
    measured_context_bytes: int | None = None

    def __post_init__(self):
        if self.kind not in ("cpu", "cuda"):
            raise ValueError(f"Device.kind must be 'cpu' or 'cuda', not {self.kind!r}")
        if self.source not in SOURCES:
            raise ValueError(f"Device.source must be one of {SOURCES}, not {self.source!r}")

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def memory_bytes(self) -> int | None:
        """Total device memory in bytes (nvidia-smi's figure); None when unknown or CPU."""
        return self.gpu.memory_bytes if self.gpu else None

    @property
    def context_bytes(self) -> int:
        """Bytes outside the caching allocator (CUDA context, kernels); 0 on the CPU."""
        if self.measured_context_bytes is not None and self.is_cuda:
            return self.measured_context_bytes
        if self.gpu:
            return self.gpu.context_bytes
        return GENERIC_CUDA_CONTEXT_BYTES if self.is_cuda else 0

    @property
    def context_source(self) -> str:
        """How context_bytes is known, for every place it is shown."""
        if self.measured_context_bytes is not None and self.is_cuda:
            return "measured by trainwise calibrate"
        return "estimated (SMs x threads + base: not measured)" if self.is_cuda else "none on the CPU"

    @property
    def cublas_workspace_bytes(self) -> int:
        """One cuBLAS workspace (per handle and stream) in bytes; 0 on the CPU."""
        if self.gpu:
            return self.gpu.cublas_workspace_bytes
        return GENERIC_CUDA_CUBLAS_WORKSPACE_BYTES if self.is_cuda else 0


def cpu_device() -> Device:
    return Device(kind="cpu", name="cpu", source="generic")


def generic_cuda_device() -> Device:
    return Device(kind="cuda", name=GENERIC_CUDA_NAME, source="generic")


def catalog_device(gpu: GPU) -> Device:
    return Device(kind="cuda", name=gpu.name, source="catalog", gpu=gpu)


def detected_device(gpu: GPU, index: int) -> Device:
    return Device(kind="cuda", name=gpu.name, source="detected", gpu=gpu, index=index)
