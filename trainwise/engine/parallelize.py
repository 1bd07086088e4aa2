"""parallelize(model, plan, device, ...): every technique of a Plan applied to a model, in
the one order every layout follows. One device is the layout with nothing enabled: the
steps it does not use leave the model as it is.

    1. precision policy and device switches (TF32), checked against the device first
    2. tensor parallel: DTensor's parallelize_module on the tp mesh (--tp); with --float8
       the split projections are converted to float8 first, for torchao's float8 styles
    3. the step recipe shared with the estimate (trainwise/techniques/recipe.py): MoE router
       loss -> LoRA adapters -> activation checkpointing -> weight dtype -> train mode
    4. pipeline split into this rank's stages on the pp mesh (--pp), then what must wait
       until the parameters sit in their place and dtype (the tensor-parallel embedding's
       gradient hook)
    5. torch.compile of each block of each model part, or of each part whole
       (engine/compile_regions.py; the compile cache is turned on by the job)
    6. with a mesh, data parallel: DDP, ZeRO-1 (DDP + sharded optimizer) or FSDP2 (ZeRO-2/3,
       and any data parallelism next to --tp or --pp: FSDP2 shards over fsdp and replicates
       over dp; DDP does not compose with DTensor); without one, the one-process --classic
       layouts (nn.DataParallel, or blocks placed vertically over the GPUs)
    7. the optimizer over this rank's parameters (foreach/fused kernels chosen explicitly;
       sharded for ZeRO-1), the LR schedule and the fp16 loss scaler, built once

Checkpointing (3) wraps whole blocks before the pipeline (4) hands them to stages, and the
stages are compiled (5) before FSDP2 or DDP (6) wraps them. The layout-specific steps are in
engine/parallel/apply.py and engine/parallel/classic.py."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from trainwise.engine.compile_regions import compile_model_parts
from trainwise.engine.parallel.apply import after_placement, data_parallel, split_pipeline, tensor_parallel
from trainwise.engine.parallel.mesh import Distributed
from trainwise.engine.runtime import apply_numeric_switches, check_precision_supported
from trainwise.engine.schedule import build_scheduler
from trainwise.engine.setup import TrainingSetup
from trainwise.plan.plan import Plan
from trainwise.techniques import build_optimizer, precision_policy, prepare_model


def parallelize(model: nn.Module, plan: Plan, device: torch.device, total_steps: int,
                task: str | None = None, distributed: Distributed | None = None) -> TrainingSetup:
    """Apply every technique of `plan` to `model` (on `device`, or on the CPU when it is
    about to be sharded or cut into stages), in the order of this module's docstring.
    `distributed` without a mesh (or None) is a one-process run."""
    policy = precision_policy(plan.precision, device.type)  # 1
    check_precision_supported(policy, device)
    apply_numeric_switches(policy)
    meshed = distributed if distributed is not None and distributed.has_mesh else None
    model = tensor_parallel(model, meshed, plan)  # 2
    model = prepare_model(model, plan, policy, task)  # 3
    pipeline, parts = split_pipeline(model, plan, meshed, device)  # 4
    after_placement(model, meshed)
    forwards = compile_model_parts(parts, plan, in_place=meshed is not None)  # 5
    if meshed is not None:  # 6
        parts, forwards = data_parallel(parts, forwards, meshed, plan, device)
    elif plan.classic != "none":
        from trainwise.engine.parallel.classic import apply_classic

        forwards = [apply_classic(parts[0], forwards[0], plan, device)]
    saved = parts[0] if len(parts) == 1 else nn.ModuleList(parts)
    optimizer = _optimizer(saved, plan, meshed, device)  # 7
    scheduler = build_scheduler(optimizer, total_steps, plan.warmup_steps, plan.lr_schedule)
    # The scaler is always built (disabled unless fp16) so checkpoints have one layout.
    scaler = torch.amp.GradScaler(device.type, enabled=policy.loss_scaling)
    return TrainingSetup(saved, forwards[0] if len(forwards) == 1 else saved, optimizer, scheduler, scaler,
                         policy, device, meshed, pipeline, _loss_context(model, meshed))


def _optimizer(saved: nn.Module, plan: Plan, distributed: Distributed | None,
               device: torch.device) -> torch.optim.Optimizer:
    """The plan's optimizer over `saved`: ZeRO-1 shards its states over the fsdp ranks."""
    if distributed is not None and distributed.layout.data_parallel_kind == "zero1":
        from trainwise.engine.parallel.data_parallel import zero_one_optimizer

        return zero_one_optimizer(saved, plan, distributed.submesh("fsdp").get_group(), device.type)
    return build_optimizer(plan, saved, device.type)


def _loss_context(model: nn.Module, distributed: Distributed | None):
    """The context the loss is computed in: DTensor's vocab-parallel cross-entropy under
    tensor parallel, else nothing."""
    if distributed is None or distributed.layout.tp == 1:
        return contextlib.nullcontext
    from trainwise.engine.parallel.tensor_parallel import tensor_parallel_loss

    return lambda: tensor_parallel_loss(model)
