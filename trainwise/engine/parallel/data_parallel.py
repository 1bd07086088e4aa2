"""Replicated data parallel: DDP, and ZeRO-1 (DDP plus an optimizer whose states are
sharded over the ranks: torch's ZeroRedundancyOptimizer)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from trainwise.plan.plan import Plan
from trainwise.techniques.optimizers import optimizer_recipe, parameter_groups


def replicate_model(model: nn.Module, group, device: torch.device) -> DistributedDataParallel:
    """DDP over `group`. Gradients are all-reduced in buckets during backward, so the
    communication overlaps the remaining backward compute."""
    device_ids = [device.index] if device.type == "cuda" else None
    # find_unused_parameters stays off: it costs a graph walk per step. MoE models leave
    # experts unused in a step; they get static_graph=False and the flag on.
    unused = _has_experts(model)
    return DistributedDataParallel(model, device_ids=device_ids, process_group=group,
                                   find_unused_parameters=unused, gradient_as_bucket_view=True)


def zero_one_optimizer(model: nn.Module, plan: Plan, group, device_type: str) -> ZeroRedundancyOptimizer:
    """The plan's optimizer with its states sharded over `group` (ZeRO stage 1): each rank
    updates its share of the parameters and broadcasts them."""
    optimizer_class, options = optimizer_recipe(plan, device_type)
    return ZeroRedundancyOptimizer(parameter_groups(model, plan.weight_decay), optimizer_class=optimizer_class,
                                   process_group=group, **options)


def _has_experts(model: nn.Module) -> bool:
    return any("expert" in name for name, _ in model.named_modules())
