"""Optimizer construction: one function, so the estimate traces the optimizer that trains."""

from __future__ import annotations


import torch
from torch import nn

from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan

# Parameters whose names contain these are never weight-decayed (biases and norm scales):
# decaying them hurts accuracy and saves nothing.
_NO_DECAY_MARKERS = ("bias", "norm", "ln_", "layernorm", "layer_norm")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters split into a decayed group and a non-decayed group."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        lowered = name.lower()
        is_vector = param.ndim < 2
        (no_decay if is_vector or any(m in lowered for m in _NO_DECAY_MARKERS) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(plan: Plan, model: nn.Module, device_type: str) -> torch.optim.Optimizer:
    """The optimizer for `plan.optim`. Multi-tensor (foreach) kernels are chosen explicitly,
    as CUDA's defaults would, so CPU runs and fake traces allocate what a GPU run does."""
    groups = parameter_groups(model, plan.weight_decay)
    if not groups:
        raise InputError("--lora-rank", "the model has no trainable parameters")
    optimizer_class, options = optimizer_recipe(plan, device_type)
    return optimizer_class(groups, **options)


def optimizer_recipe(plan: Plan, device_type: str) -> tuple[type, dict]:
    """The optimizer class for `plan.optim` and its keyword arguments (learning rate and
    kernel choice); ZeRO-1 hands both to ZeroRedundancyOptimizer, which builds one per rank."""
    if plan.optim == "adamw":
        return torch.optim.AdamW, {"lr": plan.lr, "foreach": True}
    if plan.optim == "adamw-fused":
        return torch.optim.AdamW, {"lr": plan.lr, "fused": True}
    if plan.optim == "sgd":
        return torch.optim.SGD, {"lr": plan.lr, "momentum": 0.9, "foreach": True}
    if plan.optim == "adafactor":
        return torch.optim.Adafactor, {"lr": plan.lr, "foreach": True}
    if plan.optim == "adamw-8bit":
        return _bitsandbytes_adamw8bit(device_type), {"lr": plan.lr}
    raise InputError("--optim", f"unknown optimizer {plan.optim!r}")


def _bitsandbytes_adamw8bit(device_type: str) -> type:
    if device_type != "cuda":
        raise InputError("--optim", "adamw-8bit (bitsandbytes) needs a CUDA device; use adamw or adafactor on cpu")
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise InputError("--optim", "adamw-8bit needs the bitsandbytes package (pip install bitsandbytes)") from None
    return bnb.optim.AdamW8bit
