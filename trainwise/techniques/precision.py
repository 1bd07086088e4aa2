"""Numeric precision: what each `--precision` value means for weights, autocast and scaling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainwise.common.errors import InputError


@dataclass(frozen=True)
class PrecisionPolicy:
    """param_dtype: dtype the weights are stored in; autocast_dtype: compute dtype under
    autocast (None = no autocast); loss_scaling: fp16 dynamic loss scaling; tf32: allow
    TF32 matmuls (Ampere and newer)."""

    name: str
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    loss_scaling: bool
    tf32: bool


_POLICIES = {
    "fp32": PrecisionPolicy("fp32", torch.float32, None, False, False),
    "tf32": PrecisionPolicy("tf32", torch.float32, None, False, True),
    # Mixed precision keeps fp32 master weights; autocast makes half copies per step.
    "fp16": PrecisionPolicy("fp16", torch.float32, torch.float16, True, False),
    "bf16": PrecisionPolicy("bf16", torch.float32, torch.bfloat16, False, False),
    # Pure bf16: the weights themselves (and so gradients and optimizer state) are bf16.
    "bf16-pure": PrecisionPolicy("bf16-pure", torch.bfloat16, None, False, False),
}


def precision_policy(name: str, device_type: str) -> PrecisionPolicy:
    """The policy for `--precision name` on a device of type 'cpu' or 'cuda'."""
    policy = _POLICIES[name]
    if device_type == "cpu" and name in ("fp16", "tf32"):
        # CPU autocast has no fp16 loss-scaling path in the engine and no TF32 units.
        raise InputError("--precision", f"{name} needs a CUDA device; on cpu use fp32, bf16 or bf16-pure")
    return policy
