"""The two numbers every rank must agree on after a step: the loss shown, and the total
gradient norm that clipping scales by.

Both are reduced with torch.distributed collectives over the whole job. Gradients held as
DTensors (FSDP shards, tensor-parallel pieces) get their global norm from DTensor itself
(`full_tensor`); plain tensors are either whole (DDP: already all-reduced) or a pipeline
stage's own, whose squares are summed over the pipeline ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainwise.engine.parallel.mesh import Distributed


def plain_loss(loss: torch.Tensor) -> torch.Tensor:
    """The loss as an ordinary tensor (a vocab-parallel loss is a replicated DTensor)."""
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def mean_loss(local: torch.Tensor | None, distributed: Distributed) -> torch.Tensor:
    """The step's loss averaged over the ranks that computed one (pipeline ranks other
    than the last have none; tensor-parallel peers hold the same value): a 0-dim float64
    tensor on the collective device, NaN when no rank had a loss. Not read here: an
    all-reduce is queued on the device, reading its result would wait for it."""
    device = _collective_device()
    if local is None:
        pair = torch.zeros(2, device=device)
    else:  # (loss, 1) on the collective device: the loss may sit on another (a GPU under gloo)
        pair = torch.stack([local.detach().float().reshape(()).to(device), torch.ones((), device=device)])
    dist.all_reduce(pair)
    total, count = pair.double().unbind()
    return total / count  # 0 / 0 is NaN, as when no rank had a loss


def all_reduce_in_place(tensor: torch.Tensor, group) -> None:
    """Sum `tensor` over `group` where it lies (a host tensor under NCCL goes through the
    GPU: CPU offload keeps gradients in host memory)."""
    device = _collective_device(group)
    if tensor.device == device:
        dist.all_reduce(tensor, group=group)
        return
    moved = tensor.to(device)
    dist.all_reduce(moved, group=group)
    tensor.copy_(moved)


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float, distributed: Distributed,
                   counted_elsewhere: tuple = ()) -> torch.Tensor:
    """Scale every gradient so that the global norm is at most `max_norm`; return the
    global norm before clipping (the same number on every rank) as a 0-dim float64 tensor
    on the collective device. The scale is applied as a device tensor, so nothing is read
    back. `counted_elsewhere`: parameters whose gradient another rank holds too and counts
    (a tied weight's copy)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    skip = {id(p) for p in counted_elsewhere}
    device = _collective_device()
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for group in _groups([p.grad for p in parameters if p.grad is not None and id(p) not in skip]):
        if distributed.layout.cpu_offload and isinstance(group[0], DTensor):
            squares = squares + _offloaded_squares(group, distributed).to(device)
            continue
        norm = torch.nn.utils.get_total_norm(group, norm_type=2.0, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares = squares + norm.double().to(device) ** 2
    if distributed.layout.pp > 1:
        # Each stage holds different parameters: their squares add up.
        dist.all_reduce(squares, group=distributed.submesh("pp").get_group())
    total = squares.sqrt()
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for group in _groups(grads):
        local = [g.to_local() if isinstance(g, DTensor) else g for g in group]  # element-wise: shards scale alike
        torch._foreach_mul_(local, coefficient.to(local[0].device, torch.float32))
    return total


def _offloaded_squares(group: list[DTensor], distributed: Distributed) -> torch.Tensor:
    """Sum of squares of DTensor gradients held in host memory (CPU offload). Their mesh is
    the GPUs', so DTensor's own norm would reduce host tensors over NCCL; the local squares
    are summed over the sharded mesh dimensions on the collective device instead."""
    local = torch.nn.utils.get_total_norm([g.to_local() for g in group], norm_type=2.0, foreach=True)
    squares = local.double().reshape(()).to(_collective_device()) ** 2
    mesh = group[0].device_mesh
    for dim, placement in enumerate(group[0].placements):
        if placement.is_shard() and mesh.size(dim) > 1:
            dist.all_reduce(squares, group=mesh.get_group(dim))
    return squares


def _groups(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Gradients that can share one foreach kernel: plain tensors by device and dtype,
    DTensors by mesh, placements and dtype."""
    groups: dict = {}
    for grad in grads:
        key = (("dtensor", id(grad.device_mesh), grad.placements, grad.dtype) if isinstance(grad, DTensor)
               else ("tensor", grad.device, grad.dtype))
        groups.setdefault(key, []).append(grad)
    return list(groups.values())


def _collective_device(group=None) -> torch.device:
    """Where tensors must be for a collective over `group` (None: the default group)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
