"""Apply a parallel layout to a prepared model, in the one documented order.

    1. tensor parallel (DTensor parallelize_module, on the tp mesh)
    2. the single-device recipe (LoRA -> activation checkpointing -> dtype), see setup.py
    3. pipeline split into this rank's stages (on the pp mesh)
    4. torch.compile (per model part)
    5. data parallel: DDP, ZeRO-1 (DDP + sharded optimizer), or FSDP2 for ZeRO-2/3, and
       for any data parallelism combined with tensor or pipeline parallel (FSDP2 shards
       over fsdp and replicates over dp; plain DDP does not compose with DTensor)
    6. the optimizer over this rank's parameters (sharded for ZeRO-1)

Steps 1 and 3 come from tensor_parallel.py and pipeline.py; 2, 4 and 6 are the single-
device functions that setup.py applies either way."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from trainwise.engine.parallel.mesh import Distributed
from trainwise.plan.errors import InputError
from trainwise.plan.plan import Plan
from trainwise.step.precision import PrecisionPolicy


@dataclass
class DataParallelChoice:
    """How data parallelism is done for a layout: "none", "ddp", "zero1" or "fsdp"."""

    kind: str
    reason: str = ""


def data_parallel_kind(distributed: Distributed) -> DataParallelChoice:
    layout = distributed.layout
    if layout.data_parallel == 1 and not layout.zero:
        return DataParallelChoice("none")
    if layout.zero == 1:
        if layout.tp > 1 or layout.pp > 1 or layout.dp > 1:
            raise InputError("--zero", "ZeRO-1 runs on plain data parallel only; with --tp, --pp or --dp use "
                                       "--zero 2 or 3")
        return DataParallelChoice("zero1", "DDP with optimizer states sharded (ZeroRedundancyOptimizer)")
    if layout.zero >= 2:
        return DataParallelChoice("fsdp", f"FSDP2 fully_shard, ZeRO-{layout.zero}")
    if layout.tp > 1 or layout.pp > 1:
        return DataParallelChoice("fsdp", "FSDP2 replicating over dp (DDP does not compose with DTensor/pipelines)")
    return DataParallelChoice("ddp", "DistributedDataParallel")


def check_layout_supported(plan: Plan, distributed: Distributed) -> None:
    """Combinations that cannot work, said before any model is built."""
    layout = distributed.layout
    if plan.lora and (layout.tp > 1 or layout.pp > 1):
        raise InputError("--lora-rank", "LoRA runs with data parallel and sharded data parallel (--dp, --fsdp, "
                                        "--zero); not with --tp or --pp")
    if plan.precision == "fp16" and layout.zero >= 2:
        raise InputError("--precision", "fp16 loss scaling is not wired to sharded gradients yet; use bf16 with "
                                        "--zero 2/3")
    data_parallel_kind(distributed)


def tensor_parallel(model: nn.Module, distributed: Distributed) -> nn.Module:
    if distributed.layout.tp == 1:
        return model
    try:
        from trainwise.engine.parallel.tensor_parallel import apply_tensor_parallel
    except ImportError:
        raise InputError("--tp", "tensor parallel is not available in this build yet") from None
    return apply_tensor_parallel(model, distributed.submesh("tp"))


def data_parallel(parts: list[nn.Module], plan: Plan, policy: PrecisionPolicy, distributed: Distributed,
                  device: torch.device) -> tuple[list[nn.Module], list[nn.Module]]:
    """Wrap or shard each model part; returns (parts to save and optimize, what forward calls)."""
    choice = data_parallel_kind(distributed)
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


@dataclass
class ParallelParts:
    """What the loop needs from a layout: the modules this rank holds (`parts`: saved,
    optimized, clipped), what the loop calls (`forwards`), and the pipeline runner."""

    parts: list[nn.Module]
    forwards: list[nn.Module]
    pipeline: object | None = None
    notes: list[str] = field(default_factory=list)


def split_pipeline(model: nn.Module, plan: Plan, distributed: Distributed, device: torch.device):
    """(runner, this rank's model parts): the whole model and no runner without --pp."""
    if distributed.layout.pp == 1:
        return None, [model]
    try:
        from trainwise.engine.parallel.pipeline import build_pipeline
    except ImportError:
        raise InputError("--pp", "pipeline parallel is not available in this build yet") from None
    from trainwise.engine.accumulation import micro_batch_loss_scale

    runner = build_pipeline(model, distributed.submesh("pp"), schedule=plan.pp_schedule,
                            microbatches=plan.microbatches or 2 * distributed.layout.pp, device=device,
                            loss_scale=micro_batch_loss_scale(plan.grad_accum))
    return runner, list(runner.stages)
