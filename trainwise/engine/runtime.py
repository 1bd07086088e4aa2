"""The real device a run uses, and the process-wide switches a Plan sets (seeds, TF32,
deterministic kernels)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from trainwise.common.errors import InputError
from trainwise.techniques.precision import PrecisionPolicy


def runtime_device(requested: str, *, explicit: bool = True) -> torch.device:
    """The torch device for `--device`: cpu, cuda[:N] or a GPU name (which must be present).

    When the user did not choose (`explicit` False) and no CUDA GPU is present, the CPU is
    used rather than failing: `trainwise train` with no arguments must work anywhere."""
    lowered = requested.strip().lower()
    if lowered == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if not explicit:
            return torch.device("cpu")
        raise InputError("--device", f"{requested} asked for, but this machine has no CUDA GPU; use --device cpu")
    if lowered.startswith("cuda"):
        device = torch.device(lowered)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError("--device", f"{requested} is not present; this machine has "
                                         f"{torch.cuda.device_count()} GPU(s)")
        return torch.device("cuda", device.index or 0)
    check_named_gpu_present(requested)
    return torch.device("cuda", 0)  # a catalog name: train on the GPU that is here, which is that one


def check_named_gpu_present(requested: str) -> None:
    """A catalog GPU name trains on the GPU present, so it must be that GPU: a plan made for
    another one would run with other memory and speed than it was chosen for."""
    from trainwise.hardware.catalog import find_gpu
    from trainwise.hardware.detect import catalog_gpu_present, detect_gpus

    gpu = find_gpu(requested)
    if gpu is None or catalog_gpu_present(gpu.name):
        return
    here = ", ".join(sorted({found.name for found in detect_gpus()})) or "none"
    raise InputError("--device", f"{requested} asked for, but this machine's GPU is {here}, not {gpu.name}; "
                                 "use --device cuda (the GPU here) or run on a machine with that GPU")


def check_precision_supported(policy: PrecisionPolicy, device: torch.device) -> None:
    """One-line errors for precisions this device cannot run."""
    if device.type != "cuda":
        return
    major, _ = torch.cuda.get_device_capability(device)
    if policy.name in ("bf16", "bf16-pure") and not torch.cuda.is_bf16_supported():
        raise InputError("--precision", f"{policy.name} needs an Ampere or newer GPU (compute capability >= 8.0, "
                                        f"this one is {major}.x); use fp16 or fp32")
    if policy.tf32 and major < 8:
        raise InputError("--precision", f"tf32 needs an Ampere or newer GPU (this one is {major}.x); use fp32 or fp16")


def apply_numeric_switches(policy: PrecisionPolicy) -> None:
    """TF32 on or off for matmuls and cuDNN convolutions, as the policy says."""
    torch.backends.cuda.matmul.allow_tf32 = policy.tf32
    torch.backends.cudnn.allow_tf32 = policy.tf32


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed python, numpy and torch (all devices); optionally force deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs a fixed workspace layout to be deterministic; flash-attn's backward
        # takes its deterministic path when this variable is set (transformers reads it).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
        # Not warn_only: a kernel without a deterministic implementation stops the run
        # (refusal_of_nondeterminism below) rather than breaking the promise quietly.
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def refusal_of_nondeterminism(error: RuntimeError, deterministic: bool) -> InputError | None:
    """The one-line refusal for torch's error when `--deterministic` met a kernel that has no
    deterministic implementation (None for any other error)."""
    text = str(error)
    marker = " does not have a deterministic implementation"
    if not deterministic or marker not in text:
        return None
    kernel = text.split(marker)[0].strip().splitlines()[-1]
    return InputError("--deterministic", f"the model runs {kernel}, which has no deterministic implementation on "
                                         "this device; drop --deterministic or change that part of the model")


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock times measure the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
