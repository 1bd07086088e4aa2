"""Tensor parallel for transposed linears: Conv1D projections (GPT-2's; which modules of a
block are Conv1D, and which fuse several projections, is the family's declaration in
trainwise/models/families/).

Conv1D is a Linear whose weight is stored transposed, [in, out]; DTensor's ColwiseParallel
and RowwiseParallel take only nn.Linear and nn.Embedding, so the split is done here, with
the same Megatron rules and the same DTensor parameters:

- column-wise: each rank holds a slice of the output features (weight [in, out/tp], its
  bias slice). The input is whole on every rank; the gradient each rank computes for it
  is a partial sum, all-reduced on the way back.
- row-wise: each rank holds a slice of the input features (weight [in/tp, out]) and gets
  the matching slice of the input; the partial products are all-reduced, then the whole
  bias is added once. Under sequence parallel they are reduce-scattered over the sequence
  (dim 1) instead, so each rank gets its slice of the sum (tensor_parallel.py).

GPT-2 fuses q, k and v into one Conv1D (`c_attn`, out = 3 x hidden). Cutting its output
columns into tp contiguous pieces would give rank 0 all of q and half of k; its weight is
instead held as [in, 3, hidden] (bias [3, hidden]) and split on the last dimension, so
every rank holds the same heads of q, k and v, laid out [q_r | k_r | v_r] in its output.
That keeps each checkpoint shard a plain slice of one tensor, which DCP can reshard; the
3-D view is the checkpoint's shape for this weight under every layout
(distributed_checkpoint.py), and a plain export writes the model's own [in, 3 x hidden].
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from trainwise.plan.partition import per_part_shape


class ShardedConv1D(nn.Module):
    """A Conv1D's weight and bias as DTensors split `kind`-wise ("colwise" | "rowwise");
    a column-wise Conv1D whose output is `parts` concatenated projections is split per
    part. Parameter names are the Conv1D's, so checkpoints keep their keys. A row-wise one
    under `sequence_parallel` returns this rank's slice of the sequence."""

    def __init__(self, conv: nn.Module, mesh: DeviceMesh, kind: str, parts: int = 1, sequence_parallel: bool = False):
        super().__init__()
        self.kind = kind
        self.sequence_parallel = sequence_parallel and kind == "rowwise"
        weight, bias = conv.weight.detach(), conv.bias.detach()
        if kind == "colwise":
            if parts > 1:  # the view the rank slices are taken from
                weight = weight.view(per_part_shape(weight.shape, parts, "weight"))
                bias = bias.view(per_part_shape(bias.shape, parts, "bias"))
            placements = ([Shard(weight.dim() - 1)], [Shard(bias.dim() - 1)])
        elif kind == "rowwise":
            placements = ([Shard(0)], [Replicate()])
        else:
            raise ValueError(f"kind must be colwise or rowwise, not {kind!r}")
        self.weight = nn.Parameter(distribute_tensor(weight, mesh, placements[0]),
                                   requires_grad=conv.weight.requires_grad)
        self.bias = nn.Parameter(distribute_tensor(bias, mesh, placements[1]), requires_grad=conv.bias.requires_grad)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # Parameters are read at call time: under FSDP they are the gathered DTensors.
        mesh = self.weight.device_mesh
        weight, bias = self.weight.to_local(), self.bias.to_local()
        rows = hidden.reshape(-1, hidden.size(-1))
        if self.kind == "colwise":
            rows = DTensor.from_local(rows, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])
            out = torch.addmm(bias.reshape(-1), rows, weight.reshape(weight.size(0), -1))
        else:
            partial = DTensor.from_local(torch.mm(rows, weight).view(*hidden.shape[:-1], -1), mesh, [Partial()],
                                         run_check=False)
            if self.sequence_parallel:  # the bias as a DTensor: its gradient sums every rank's slice
                return (partial.redistribute(mesh, [Shard(1)]) + self.bias).to_local()
            out = partial.redistribute(mesh, [Replicate()]).to_local() + bias
        return out.view(*hidden.shape[:-1], out.size(-1))

    def extra_repr(self) -> str:
        return f"{self.kind}, weight {tuple(self.weight.shape)}"
