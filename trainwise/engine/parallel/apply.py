"""The layout-specific steps of engine/parallelize.py (its docstring gives the one order):
tensor parallel (2), the pipeline split and what waits for placement (4), data parallel
(6). Each takes the run's Distributed, or None for a one-process run, and then leaves the
model as it is."""

from __future__ import annotations

import torch
from torch import nn

from trainwise.engine.parallel.mesh import Distributed
from trainwise.plan.fsdp_settings import FsdpSettings
from trainwise.plan.plan import Plan


def tensor_parallel(model: nn.Module, distributed: Distributed | None, plan: Plan) -> nn.Module:
    """DTensor's parallelize_module on the tp mesh (in place), under --tp; with --float8 the
    split projections become Float8Linear first, for torchao's float8 styles."""
    if distributed is None or distributed.layout.tp == 1:
        return model
    from trainwise.engine.parallel.tensor_parallel import apply_tensor_parallel, convert_float8_before_split

    if plan.float8:
        model = convert_float8_before_split(model, plan, distributed.layout.tp)
    return apply_tensor_parallel(model, distributed.submesh("tp"), distributed.layout.sequence_parallel)


def after_placement(model: nn.Module, distributed: Distributed | None) -> None:
    """What must wait until the parameters sit on their device in their dtype."""
    if distributed is not None and distributed.layout.tp > 1:
        from trainwise.engine.parallel.tensor_parallel import keep_embedding_gradient_sharded

        keep_embedding_gradient_sharded(model)


def data_parallel(parts: list[nn.Module], forwards: list[nn.Module], distributed: Distributed, plan: Plan,
                  device: torch.device) -> tuple[list[nn.Module], list[nn.Module]]:
    """Wrap or shard each model part as the layout's data_parallel_kind says; returns
    (parts to save and optimize, what forward calls). `forwards` are the parts as compiled
    (in place, so the same modules) and pass through where nothing wraps them."""
    layout = distributed.layout
    kind = layout.data_parallel_kind
    if kind == "none":
        return parts, forwards
    if kind in ("ddp", "zero1"):
        from trainwise.engine.parallel.data_parallel import replicate_model

        group = distributed.submesh("dp" if kind == "ddp" else "fsdp").get_group()
        return parts, [replicate_model(part, group, device) for part in parts]
    from trainwise.engine.parallel.fsdp import shard_model

    mesh = distributed.submesh("dp", "fsdp") if layout.dp > 1 else distributed.submesh("fsdp")
    settings = FsdpSettings.for_layout(layout, plan.precision)
    sharded = [shard_model(part, mesh, settings) for part in parts]
    return sharded, sharded


def split_pipeline(model: nn.Module, plan: Plan, distributed: Distributed | None, device: torch.device):
    """(runner, this rank's model parts): the whole model and no runner without --pp."""
    if distributed is None or distributed.layout.pp == 1:
        return None, [model]
    from trainwise.engine.accumulation import micro_batch_loss_scale
    from trainwise.engine.parallel.pipeline_parallel import build_pipeline
    from trainwise.plan.partition import check_pipeline

    layout = distributed.layout
    base = getattr(model, "get_base_model", lambda: model)()
    check_pipeline(base.config, layout.pp, plan.pp_schedule, layout.microbatches, plan.batch_size)
    runner = build_pipeline(model, distributed.mesh, schedule=plan.pp_schedule, microbatches=layout.microbatches,
                            device=device, loss_scale=micro_batch_loss_scale(plan.grad_accum),
                            sequence_shards=layout.tp if layout.sequence_parallel else 1)
    return runner, list(runner.stages)
