"""Apply a parallel layout to a prepared model, in the one documented order.

    1. tensor parallel (DTensor parallelize_module, on the tp mesh)
    2. the single-device recipe (LoRA -> activation checkpointing -> dtype), see setup.py
    3. pipeline split into this rank's stages (on the pp mesh)
    4. torch.compile (per model part)
    5. data parallel: DDP, ZeRO-1 (DDP + sharded optimizer), or FSDP2 for ZeRO-2/3, and
       for any data parallelism combined with tensor or pipeline parallel (FSDP2 shards
       over fsdp and replicates over dp; plain DDP does not compose with DTensor)
    6. the optimizer over this rank's parameters (sharded for ZeRO-1)

Steps 1 and 3 come from tensor_parallel.py and pipeline_parallel.py; 2, 4 and 6 are the single-
device functions that setup.py applies either way."""

from __future__ import annotations

import torch
from torch import nn

from trainwise.engine.parallel.mesh import Distributed
from trainwise.plan.partition import data_parallel_choice
from trainwise.plan.plan import Plan
from trainwise.step.precision import PrecisionPolicy


def tensor_parallel(model: nn.Module, distributed: Distributed) -> nn.Module:
    if distributed.layout.tp == 1:
        return model
    from trainwise.engine.parallel.tensor_parallel import apply_tensor_parallel

    return apply_tensor_parallel(model, distributed.submesh("tp"), distributed.layout.sequence_parallel)


def after_placement(model: nn.Module, distributed: Distributed) -> None:
    """What must wait until the parameters sit on their device in their dtype."""
    if distributed.layout.tp > 1:
        from trainwise.engine.parallel.tensor_parallel import keep_embedding_gradient_sharded

        keep_embedding_gradient_sharded(model)


def data_parallel(parts: list[nn.Module], plan: Plan, policy: PrecisionPolicy, distributed: Distributed,
                  device: torch.device) -> tuple[list[nn.Module], list[nn.Module]]:
    """Wrap or shard each model part; returns (parts to save and optimize, what forward calls)."""
    choice = data_parallel_choice(distributed.layout)
    layout = distributed.layout
    if choice.kind == "none":
        return parts, parts
    if choice.kind in ("ddp", "zero1"):
        from trainwise.engine.parallel.data_parallel import replicate_model

        group = distributed.submesh("dp" if choice.kind == "ddp" else "fsdp").get_group()
        return parts, [replicate_model(part, group, device) for part in parts]
    from trainwise.engine.parallel.fsdp import shard_model

    mesh = distributed.submesh("dp", "fsdp") if layout.dp > 1 else distributed.submesh("fsdp")
    sharded = [shard_model(part, mesh, zero=max(layout.zero, 2), cpu_offload=layout.cpu_offload, policy=policy)
               for part in parts]
    return sharded, sharded


def split_pipeline(model: nn.Module, plan: Plan, distributed: Distributed, device: torch.device):
    """(runner, this rank's model parts): the whole model and no runner without --pp."""
    if distributed.layout.pp == 1:
        return None, [model]
    from trainwise.engine.accumulation import micro_batch_loss_scale
    from trainwise.engine.parallel.pipeline_parallel import build_pipeline
    from trainwise.plan.partition import check_pipeline, pipeline_microbatches

    microbatches = pipeline_microbatches(plan, distributed.layout.pp)
    base = getattr(model, "get_base_model", lambda: model)()
    check_pipeline(base.config, distributed.layout.pp, plan.pp_schedule, microbatches, plan.batch_size)
    runner = build_pipeline(model, distributed.mesh, schedule=plan.pp_schedule, microbatches=microbatches,
                            device=device, loss_scale=micro_batch_loss_scale(plan.grad_accum))
    return runner, list(runner.stages)
