"""Hardware: the GPU catalog, detection of this machine's GPUs, and the Device a plan targets."""

from trainwise.hardware.catalog import catalog, find_gpu, gpu_names
from trainwise.hardware.cuda_overheads import cublas_workspace_bytes, estimate_context_bytes
from trainwise.hardware.detect import DetectedGPU, detect_gpus, match_catalog
from trainwise.hardware.device import Device
from trainwise.hardware.gpu import DTYPES, GPU, PeakFlops
from trainwise.hardware.resolve import resolve_device

__all__ = [
    "DTYPES",
    "DetectedGPU",
    "Device",
    "GPU",
    "PeakFlops",
    "catalog",
    "cublas_workspace_bytes",
    "detect_gpus",
    "estimate_context_bytes",
    "find_gpu",
    "gpu_names",
    "match_catalog",
    "resolve_device",
]
