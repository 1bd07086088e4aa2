"""What this installation cannot run, found before any process is started: such a row is
shown as skipped, with the reason. (What a *device* or this installation cannot do, fp16 on a
CPU or flash without flash-attn, is trainwise.api.compatibility's to decide, for every
command alike; this file covers compilers and the layouts bench does not run yet.)"""

from __future__ import annotations

import importlib.util
import shutil

from trainwise.plan.plan import Plan


def skip_reason(plan: Plan, device_type: str) -> str | None:
    """Why `plan` cannot run here on a `device_type` ('cpu'/'cuda') device, or None."""
    import torch

    if device_type == "cuda" and not torch.cuda.is_available():
        return "this machine has no CUDA GPU (use --device cpu)"
    if plan.is_distributed or plan.cpu_offload:
        return "parallel layouts are not benched yet (each row trains on one device)"
    if plan.compile:
        return compile_unavailable(device_type)
    return None


def compile_unavailable(device_type: str) -> str | None:
    """Why torch.compile cannot run here, or None. Inductor generates C++ on a CPU and
    Triton kernels on a GPU; without the compiler or package it fails at the first step."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python/platform"
    if device_type == "cpu" and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        return "torch.compile on a CPU needs a C++ compiler (none found on PATH)"
    if device_type == "cuda" and not _installed("triton"):
        return "torch.compile on a GPU needs the triton package"
    return None


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None
