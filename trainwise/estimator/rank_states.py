"""One rank's model states, sized exactly: its parameters at their tensor-parallel shapes
(a pipeline rank's stage parts only), sharded as FSDP2 shards them (dimension 0, rank 0
holding the rounded-up share) or partitioned as ZeroRedundancyOptimizer does (whole
parameters, largest first, to the least loaded rank), and the optimizer states the real
optimizer creates on fake tensors of those shapes (so Adafactor's factored and 8-bit
Adam's quantised states come out as they would)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from trainwise.estimator.rank_view import RankModel, RankView
from trainwise.models.families import family_of
from trainwise.plan.partition import per_part_shape, zero_one_owner
from trainwise.plan.plan import Plan
from trainwise.techniques.float8 import gathered_in_float8

STATE_KEYS = ("weights", "gradients", "optimizer")


@dataclass(frozen=True)
class RankParameter:
    name: str
    shape: tuple[int, ...]  # after tensor parallel
    dtype: torch.dtype
    trainable: bool
    copies: int  # blocks holding one like it
    in_block: bool
    # Bytes per element FSDP2 all-gathers it in when the parameter decides that itself
    # (torchao's float8 weights: 1); None: the precision policy's compute dtype.
    gathered_itemsize: int | None = None


def rank_parameters(rank_model: RankModel, plan: Plan, policy, view: RankView, tp: int = 1) -> list[RankParameter]:
    """The rank's parameters at their tensor-parallel shapes, built from a one-block model
    (blocks are identical; each block parameter stands for `view.blocks` copies) where the
    model is one stack of blocks, else from the whole model."""
    from trainwise.techniques.checkpointing import largest_module_list
    from trainwise.techniques.recipe import prepare_model

    one_block = view.blocks > 0 and rank_model.single_stack
    model = prepare_model(rank_model.build(1 if one_block else None), plan, policy, rank_model.task)
    base = getattr(model, "get_base_model", lambda: model)()
    blocks = largest_module_list(base) if one_block else None
    in_block = {id(p) for p in blocks.parameters()} if blocks is not None else set()
    held_by = {}  # parameter id -> the pipeline ends ("first", "last") holding it; both for a tied head
    if not (view.has_embedding and view.has_head):  # a pipeline stage
        parts = family_of(rank_model.config).pipeline
        for end, paths in (("first", parts.first), ("last", parts.last)):
            for path in paths:
                for p in base.get_submodule(path).parameters():
                    held_by.setdefault(id(p), set()).add(end)
    family = family_of(rank_model.config)
    fused = family.fused_projections if family is not None else {}
    params = []
    for name, param in model.named_parameters():
        ends = held_by.get(id(param))
        if ends and not (("first" in ends and view.has_embedding) or ("last" in ends and view.has_head)):
            continue
        block = id(param) in in_block
        params.append(RankParameter(name, _held_shape(name, tuple(param.shape), fused if tp > 1 else {}), param.dtype,
                             param.requires_grad, view.blocks if block else 1, block,
                             1 if plan.float8 and gathered_in_float8(param) else None))
    return params


def _held_shape(name: str, shape: tuple[int, ...], fused: dict[str, int]) -> tuple[int, ...]:
    """The shape the engine holds a parameter in: tensor parallel keeps a fused
    projection per part (engine/parallel/conv1d_parallel.py), which FSDP2 then shards on
    its first dimension (a bias [3, n] splits by rows, not by elements)."""
    for path, parts in fused.items():
        for kind, whole_dims in (("weight", 2), ("bias", 1)):
            if name.endswith(f".{path}.{kind}") and len(shape) == whole_dims:
                return per_part_shape(shape, parts, kind)
    return shape


def shard_shape(shape: tuple[int, ...], shards: int) -> tuple[int, ...]:
    """Rank 0's FSDP2 shard: dimension 0 split, rounded up (the last ranks hold the padding)."""
    if shards == 1 or not shape:
        return shape
    return (-(-shape[0] // shards), *shape[1:])


def state_bytes(params: list[RankParameter], plan: Plan, device_type: str, shards: int, zero_one_ranks: int) -> dict:
    """Rank 0's weights, gradients and optimizer states in bytes: FSDP2 shards all three
    over `shards` ranks; ZeRO-1 gives rank 0 the optimizer states of its partition."""
    weights = gradients = 0
    for p in params:
        local = p.copies * math.prod(shard_shape(p.shape, shards)) * p.dtype.itemsize
        weights += local
        gradients += local if p.trainable else 0
    per_param, groups = _optimizer_state_bytes(params, plan, device_type, shards)
    if zero_one_ranks > 1:
        sizes = [[math.prod(params[i].shape) for i in group for _ in range(params[i].copies)] for group in groups]
        owners = zero_one_owner(sizes, zero_one_ranks)
        optimizer = 0
        for group, group_owners in zip(groups, owners):
            expanded = [i for i in group for _ in range(params[i].copies)]
            optimizer += sum(per_param[i] for i, owner in zip(expanded, group_owners) if owner == 0)
    else:
        optimizer = sum(per_param[i] * params[i].copies for i in per_param)
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer}


def _optimizer_state_bytes(params: list[RankParameter], plan: Plan, device_type: str, shards: int):
    """({parameter index: its optimizer-state bytes on the device}, parameter indices per
    optimizer group), from the real optimizer's state on fake tensors of the shard shapes."""
    from trainwise.trace.step_trace import create_optimizer_state, device_step_counter, traced_optimizer

    with FakeTensorMode():
        holder = nn.Module()
        fakes = {}
        for index, p in enumerate(params):
            # Names keep what decides weight decay (norm/bias markers, dimensions).
            fake = nn.Parameter(torch.empty(shard_shape(p.shape, shards), dtype=p.dtype), requires_grad=p.trainable)
            holder.register_parameter(f"p{index}_" + p.name.replace(".", "_"), fake)
            fakes[id(fake)] = index
        optimizer = traced_optimizer(plan, holder, device_type)
        create_optimizer_state(holder, optimizer)
        per_param: dict[int, int] = {}
        groups = []
        for group in optimizer.param_groups:
            groups.append([fakes[id(p)] for p in group["params"]])
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                per_param[fakes[id(p)]] = sum(
                    t.nbytes for key, t in state.items()
                    if isinstance(t, torch.Tensor) and (key != "step" or device_step_counter(group, device_type)))
    return per_param, groups
