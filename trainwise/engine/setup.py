"""apply(plan, model): turn a Plan into the objects one training step needs, in one order.

    1. precision policy and device switches (TF32) — checked against the device first
    2. the step recipe shared with the estimate (trainwise.step.prepare_model):
       LoRA adapters -> gradient checkpointing -> weight dtype -> train mode
    3. torch.compile of the prepared model (the uncompiled module is kept for saving)
    4. optimizer (foreach/fused kernels chosen explicitly), LR schedule, fp16 loss scaler

Later layouts (tensor/pipeline/data parallel) slot in between 2 and 4, as DESIGN.md says.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainwise.engine.runtime import apply_numeric_switches, check_precision_supported
from trainwise.engine.schedule import build_scheduler
from trainwise.plan.errors import InputError
from trainwise.plan.plan import Plan
from trainwise.step import build_optimizer, precision_policy, prepare_model
from trainwise.step.precision import PrecisionPolicy


@dataclass
class TrainingSetup:
    """What the loop runs. `model` is the module whose weights are saved; `forward` is
    what the loop calls (the compiled module under --compile, else `model` itself)."""

    model: nn.Module
    forward: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    policy: PrecisionPolicy
    device: torch.device


def apply_plan(model: nn.Module, plan: Plan, device: torch.device, total_steps: int,
               task: str | None = None) -> TrainingSetup:
    """Apply every single-device technique of `plan` to `model` (already on `device`)."""
    policy = precision_policy(plan.precision, device.type)
    check_precision_supported(policy, device)
    apply_numeric_switches(policy)
    model = prepare_model(model, plan, policy, task)
    forward = compile_model(model, plan) if plan.compile else model
    optimizer = build_optimizer(plan, model, device.type)
    scheduler = build_scheduler(optimizer, total_steps, plan.warmup_steps, plan.lr_schedule)
    # The scaler is always built (disabled unless fp16) so checkpoints have one layout.
    scaler = torch.amp.GradScaler(device.type, enabled=policy.loss_scaling)
    return TrainingSetup(model, forward, optimizer, scheduler, scaler, policy, device)


def compile_model(model: nn.Module, plan: Plan) -> nn.Module:
    """torch.compile with the plan's mode. The first steps compile (slow); the throughput
    summary skips them (RunConfig.timing_warmup)."""
    try:
        import torch._inductor  # noqa: F401 - fails early where the compiler stack is missing
    except ImportError as err:
        raise InputError("--compile", f"torch.compile is unavailable in this torch build ({err})") from None
    return torch.compile(model, mode=None if plan.compile_mode == "default" else plan.compile_mode)
