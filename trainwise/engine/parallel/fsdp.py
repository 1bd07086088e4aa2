"""Sharded data parallel (ZeRO-2 and -3) with FSDP2's `fully_shard`, one unit per
transformer block and one for the rest of the model.

ZeRO-2 keeps each block's parameters gathered from its forward until its backward
(`reshard_after_forward=False`: more memory, one all-gather per step); ZeRO-3 frees them
after the forward and gathers again in backward. Gradients are reduce-scattered either
way, so both shard gradients and optimizer states. With a (dp, fsdp) mesh FSDP2 shards
within each fsdp group and replicates across dp: hybrid sharding, and with fsdp = 1 plain
replication (how data parallel composes with tensor and pipeline parallel here)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from trainwise.step.checkpointing import largest_module_list
from trainwise.step.precision import PrecisionPolicy


def shard_model(model: nn.Module, mesh: DeviceMesh, *, zero: int, cpu_offload: bool,
                policy: PrecisionPolicy) -> nn.Module:
    """fully_shard every block of `model`, then the model itself (in place)."""
    options = dict(mesh=mesh, reshard_after_forward=zero >= 3, mp_policy=mixed_precision(policy),
                   offload_policy=CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload
                   else OffloadPolicy())
    blocks = largest_module_list(model)
    for block in blocks or ():
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def mixed_precision(policy: PrecisionPolicy) -> MixedPrecisionPolicy:
    """bf16 mixed precision: FSDP gathers bf16 copies of the fp32 shards for compute and
    reduces gradients in fp32 (summing many bf16 gradients would lose bits). Other
    precisions compute in the parameters' own dtype."""
    if policy.name == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()
