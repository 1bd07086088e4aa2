"""Sharded data parallel (ZeRO-2 and -3) with FSDP2's `fully_shard`, one unit per
transformer block and one for the rest of the model.

ZeRO-2 keeps each block's parameters gathered from its forward until its backward
(`reshard_after_forward=False`: more memory, one all-gather per step); ZeRO-3 frees them
after the forward and gathers again in backward. Gradients are reduce-scattered either
way, so both shard gradients and optimizer states. With a (dp, fsdp) mesh FSDP2 shards
within each fsdp group and replicates across dp: hybrid sharding, and with fsdp = 1 plain
replication (how data parallel composes with tensor and pipeline parallel here).

The settings (resharding, bf16 gathers, offload, prefetch depth) come from
trainwise/plan/fsdp_settings.py, which the per-rank estimate reads too."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from trainwise.plan.fsdp_settings import FsdpSettings
from trainwise.techniques.block_stacks import stacked_blocks


def shard_model(model: nn.Module, mesh: DeviceMesh, settings: FsdpSettings) -> nn.Module:
    """fully_shard every block of `model` (techniques/block_stacks.py), then the model
    itself (in place). Prefetching is
    FSDP2's implicit one (settings.prefetch_blocks names its depth)."""
    options = dict(mesh=mesh, reshard_after_forward=settings.reshard_after_forward,
                   mp_policy=mixed_precision(settings),
                   offload_policy=CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if settings.cpu_offload
                   else OffloadPolicy())
    for block in stacked_blocks(model):  # every stack's: an encoder-decoder's encoder and decoder blocks
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def mixed_precision(settings: FsdpSettings) -> MixedPrecisionPolicy:
    """bf16 mixed precision: FSDP gathers bf16 copies of the fp32 shards for compute and
    reduces gradients in fp32 (summing many bf16 gradients would lose bits). Other
    precisions compute in the parameters' own dtype."""
    if settings.gathers_bf16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()
