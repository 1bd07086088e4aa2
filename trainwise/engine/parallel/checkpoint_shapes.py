"""The shape a distributed checkpoint stores each weight in.

DCP reshards on load by matching each rank's piece to slices of the saved tensor, so a
piece must be one plain slice. Tensor parallel holds a fused projection (one its family
declares in fused_projections, e.g. GPT-2's c_attn: q, k and v side by side,
[in, 3 x hidden]) as [in, 3, hidden] split on the last dimension (conv1d_parallel.py); in
the model's own shape a rank's piece would be three column blocks. So every layout stores such a weight, and the optimizer states shaped like
it, per part, [in, parts, out / parts]: a view, no copy, and a plain slice under FSDP too
(it shards the first dimension). The fused bias is stored in the model's shape, [out]:
FSDP's halves of it are not whole parts, and tensor parallel's per-part pieces of it (a
few kilobytes a block) are gathered to save and cut again after loading.

    checkpoint_state = to_checkpoint_shapes(state, fused)   # before dcp.save / dcp.load
    state = to_model_shapes(checkpoint_state, state)         # after dcp.load
    plain = to_transformers_shapes(whole_state, fused)       # for save_pretrained
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate

from trainwise.models.families import family_of
from trainwise.plan.partition import per_part_shape


def fused_projections(model) -> dict[str, int]:
    """{module path inside a block: parts} for the model's family (empty if none)."""
    base = getattr(model, "get_base_model", lambda: model)()
    family = family_of(getattr(base, "config", None))
    return family.fused_projections if family is not None else {}


def to_checkpoint_shapes(state: dict, fused: dict[str, int]) -> dict:
    """`state` (parameter name -> tensor, or -> {state name: tensor} as in an optimizer's
    state) with every fused projection's weight, and the tensors shaped like it, viewed
    per part (tensor parallel's already are), and tensor parallel's per-part biases
    gathered whole (a collective: every rank calls it)."""
    return {name: _per_part(value, *_fused_entry(name, fused)) for name, value in state.items()}


def to_model_shapes(state: dict, model_state: dict) -> dict:
    """The inverse of to_checkpoint_shapes: each tensor viewed back to the shape its entry
    has in `model_state` (what to_checkpoint_shapes was given)."""
    return {name: _like(value, model_state[name]) for name, value in state.items()}


def to_transformers_shapes(state: dict, fused: dict[str, int]) -> dict:
    """Whole tensors (name -> tensor) in the shapes the transformers model has: fused
    projections held per part joined again, [in, parts, n] -> [in, parts x n]."""
    def joined(name, tensor):
        parts, kind = _fused_entry(name, fused)
        if parts > 1 and tensor.dim() == (3 if kind == "weight" else 2):
            return tensor.reshape(*tensor.shape[:-2], -1)
        return tensor
    return {name: joined(name, tensor) for name, tensor in state.items()}


def _fused_entry(name: str, fused: dict[str, int]) -> tuple[int, str]:
    """(parts, "weight" | "bias") of a fused projection's parameter; (1, "") otherwise."""
    for path, parts in fused.items():
        for kind in ("weight", "bias"):
            if name.endswith(f".{path}.{kind}"):
                return parts, kind
    return 1, ""


def _per_part(value, parts: int, kind: str):
    if isinstance(value, dict):
        return {key: _per_part(item, parts, kind) for key, item in value.items()}
    if parts == 1 or not isinstance(value, torch.Tensor):
        return value
    if kind == "weight" and value.dim() == 2:  # [in, out]
        return value.view(per_part_shape(value.shape, parts, kind))
    if kind == "bias" and value.dim() == 2:  # tensor parallel's [parts, out / parts]
        return value.full_tensor().reshape(-1)
    return value


def _like(value, reference):
    if isinstance(value, dict):
        return {key: _like(item, reference[key]) for key, item in value.items()}
    if isinstance(reference, DTensor) and not isinstance(value, DTensor):  # a gathered bias: cut it again
        mesh = reference.device_mesh
        whole = DTensor.from_local(value.view(reference.shape), mesh, [Replicate()] * mesh.ndim, run_check=False)
        return whole.redistribute(mesh, reference.placements)  # from replicated to shards: no communication
    if isinstance(value, torch.Tensor) and value.shape != reference.shape:
        return value.view(reference.shape)
    return value
