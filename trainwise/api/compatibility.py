"""Knob combinations a device cannot run, and knobs `estimate` does not model yet."""

from __future__ import annotations

from trainwise.hardware import Device
from trainwise.plan.errors import InputError, NotSupportedYet
from trainwise.plan.plan import Plan


def check_device_support(plan: Plan, device: Device) -> None:
    """Reject what the target device cannot do, naming the knob and the way out."""
    gpu = device.gpu
    if device.kind == "cpu":
        if plan.precision in ("fp16", "tf32"):
            raise InputError("--precision", f"{plan.precision} needs a CUDA device; on cpu use fp32, bf16 or bf16-pure")
        if plan.optim == "adamw-8bit":
            raise InputError("--optim", "adamw-8bit (bitsandbytes) needs a CUDA device; on cpu use adamw or adafactor")
        if plan.attention == "flash":
            raise InputError("--attention", "flash needs a CUDA GPU (compute capability 8.0+); on cpu use sdpa or eager")
        return
    if gpu is None:
        return
    capability = "{}.{}".format(*gpu.compute_capability)
    if plan.precision in ("bf16", "bf16-pure") and not gpu.supports_bf16:
        raise InputError("--precision", f"{plan.precision} needs compute capability 8.0+; {gpu.name} has {capability}: use fp16")
    if plan.precision == "tf32" and not gpu.supports_tf32:
        raise InputError("--precision", f"tf32 needs compute capability 8.0+; {gpu.name} has {capability}: use fp32 or fp16")
    if plan.attention == "flash" and not gpu.supports_flash_attention:
        raise InputError("--attention", f"flash needs compute capability 8.0+; {gpu.name} has {capability}: use sdpa")


def check_estimate_support(plan: Plan) -> None:
    """Knobs declared in the Plan whose memory effect `estimate` does not model yet."""
    if plan.compile:
        raise NotSupportedYet("--compile", "estimate (its memory is at most the eager estimate; drop the flag)")
