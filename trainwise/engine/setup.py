"""apply(plan, model): turn a Plan into the objects one training step needs, in one order.

    1. precision policy and device switches (TF32) — checked against the device first
    2. tensor parallel (distributed runs with --tp)
    3. the step recipe shared with the estimate (trainwise.step.prepare_model):
       LoRA adapters -> gradient checkpointing -> weight dtype -> train mode
    4. pipeline split into this rank's stages (--pp)
    5. torch.compile of each model part (the uncompiled module is kept for saving)
    6. data parallel: DDP, ZeRO-1, or FSDP2 sharding (engine/parallel/apply.py)
    7. optimizer (foreach/fused kernels chosen explicitly; sharded for ZeRO-1), LR
       schedule, fp16 loss scaler
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from trainwise.engine.parallel.mesh import Distributed
from trainwise.engine.runtime import apply_numeric_switches, check_precision_supported
from trainwise.engine.schedule import build_scheduler
from trainwise.plan.errors import InputError
from trainwise.plan.plan import Plan
from trainwise.step import build_optimizer, precision_policy, prepare_model
from trainwise.step.precision import PrecisionPolicy


@dataclass
class TrainingSetup:
    """What the loop runs. `model` is the module whose weights are saved; `forward` is
    what the loop calls (the compiled or DDP-wrapped module, else `model` itself). In a
    distributed run `distributed` says where this rank is; under pipeline parallel,
    `pipeline` runs the step and `model` holds this rank's stages."""

    model: nn.Module
    forward: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    policy: PrecisionPolicy
    device: torch.device
    distributed: Distributed | None = None
    pipeline: object | None = None
    loss_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def apply_plan(model: nn.Module, plan: Plan, device: torch.device, total_steps: int,
               task: str | None = None, distributed: Distributed | None = None) -> TrainingSetup:
    """Apply every technique of `plan` to `model` (on `device`, or on the CPU when it is
    about to be sharded), in the order of this module's docstring."""
    policy = precision_policy(plan.precision, device.type)
    check_precision_supported(policy, device)
    apply_numeric_switches(policy)
    if distributed is not None and distributed.mesh is not None:
        return _apply_distributed(model, plan, policy, device, total_steps, task, distributed)
    model = prepare_model(model, plan, policy, task)
    forward = compile_model(model, plan) if plan.compile else model
    if plan.classic != "none":
        forward = classic_layout(model, forward, plan, device)
    optimizer = build_optimizer(plan, model, device.type)
    scheduler = build_scheduler(optimizer, total_steps, plan.warmup_steps, plan.lr_schedule)
    # The scaler is always built (disabled unless fp16) so checkpoints have one layout.
    scaler = torch.amp.GradScaler(device.type, enabled=policy.loss_scaling)
    return TrainingSetup(model, forward, optimizer, scheduler, scaler, policy, device)


def classic_layout(model: nn.Module, forward: nn.Module, plan: Plan, device: torch.device) -> nn.Module:
    """--classic: nn.DataParallel or blocks placed vertically over the visible GPUs."""
    from trainwise.engine.parallel.classic import classic_devices, data_parallel_module, place_vertically

    # One process over at least two GPUs: anything else was refused up front
    # (trainwise/api/compatibility.py), since it would change nothing.
    devices = classic_devices(device)
    if plan.classic == "vertical":
        place_vertically(model, devices)
        return forward
    return data_parallel_module(forward, devices)


def compile_model(model: nn.Module, plan: Plan) -> nn.Module:
    """torch.compile with the plan's mode. The first steps compile (slow); the throughput
    summary skips them (RunConfig.timing_warmup)."""
    try:
        import torch._inductor  # noqa: F401 - fails early where the compiler stack is missing
    except ImportError as err:
        raise InputError("--compile", f"torch.compile is unavailable in this torch build ({err})") from None
    return torch.compile(model, mode=None if plan.compile_mode == "default" else plan.compile_mode)


def _apply_distributed(model: nn.Module, plan: Plan, policy: PrecisionPolicy, device: torch.device,
                       total_steps: int, task: str | None, distributed: Distributed) -> TrainingSetup:
    from trainwise.engine.parallel.apply import after_placement, data_parallel, split_pipeline, tensor_parallel
    from trainwise.plan.partition import data_parallel_choice

    model = tensor_parallel(model, distributed)
    model = prepare_model(model, plan, policy, task)
    pipeline, parts = split_pipeline(model, plan, distributed, device)
    after_placement(model, distributed)
    if plan.compile:
        for part in parts:  # compiled in place: pipelines and FSDP keep their module objects
            part.compile(mode=None if plan.compile_mode == "default" else plan.compile_mode)
    parts, forwards = data_parallel(parts, plan, policy, distributed, device)
    saved = parts[0] if len(parts) == 1 else nn.ModuleList(parts)
    if data_parallel_choice(distributed.layout).kind == "zero1":
        from trainwise.engine.parallel.data_parallel import zero_one_optimizer

        optimizer = zero_one_optimizer(saved, plan, distributed.submesh("fsdp").get_group(), device.type)
    else:
        optimizer = build_optimizer(plan, saved, device.type)
    scheduler = build_scheduler(optimizer, total_steps, plan.warmup_steps, plan.lr_schedule)
    scaler = torch.amp.GradScaler(device.type, enabled=policy.loss_scaling)
    loss_context = contextlib.nullcontext
    if distributed.layout.tp > 1:
        from trainwise.engine.parallel.tensor_parallel import tensor_parallel_loss

        loss_context = lambda: tensor_parallel_loss(model)  # noqa: E731
    return TrainingSetup(saved, forwards[0] if len(forwards) == 1 else saved, optimizer, scheduler, scaler, policy,
                         device, distributed, pipeline, loss_context)
