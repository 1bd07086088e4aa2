"""Autocast as the target device would apply it (placeholder for CUDA emulation)."""

from __future__ import annotations

import contextlib

import torch

from trainwise.step.precision import PrecisionPolicy


def autocast_for_target(policy: PrecisionPolicy, target_device_type: str):
    if policy.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=policy.autocast_dtype)
