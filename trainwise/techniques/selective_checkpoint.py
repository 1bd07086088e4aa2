"""Selective activation checkpointing: inside a checkpointed block, keep the outputs of the
expensive ops (matrix products, fused attention kernels) and recompute only the cheap ones
(norms, activations, element-wise arithmetic) in backward.

Full checkpointing re-runs a block's whole forward in backward (about a third more FLOPs);
this policy re-runs only memory-bound ops, whose outputs are the same size as a matmul's but
cost a small fraction of its time to rebuild. It goes through PyTorch's selective
checkpoint API: `context_fn` of non-reentrant `torch.utils.checkpoint.checkpoint`."""

from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# Matrix products as aten sees them after `linear` and `matmul` decompose (addmm with a
# bias, mm without, bmm for batched products), and the fused attention kernels' forwards.
_SAVED_OP_NAMES = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_grouped_mm", "convolution",
                   "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                   "_flash_attention_forward", "_efficient_attention_forward")
SAVED_OPS = frozenset(getattr(torch.ops.aten, name) for name in _SAVED_OP_NAMES if hasattr(torch.ops.aten, name))


# Callbacks shown each output the policy keeps in forward (`observe_kept`): the memory trace
# and its CPU reference count them as saved activations, which autograd's saved-tensor
# hooks do not see (the checkpoint holds them in its own cache).
_KEPT_OBSERVERS: list = []


def keep_matmuls_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """MUST_SAVE for a matrix product or attention kernel, PREFER_RECOMPUTE for every other op."""
    if op.overloadpacket not in SAVED_OPS:
        return CheckpointPolicy.PREFER_RECOMPUTE
    if _KEPT_OBSERVERS and not ctx.is_recompute:
        for tensor in tree_leaves(getattr(ctx, "op_output", None)):
            if isinstance(tensor, torch.Tensor):
                for observer in _KEPT_OBSERVERS:
                    observer(tensor)
    return CheckpointPolicy.MUST_SAVE


@contextlib.contextmanager
def observe_kept(callback):
    """Call `callback(tensor)` on each output the selective policy keeps, while inside."""
    _KEPT_OBSERVERS.append(callback)
    try:
        yield
    finally:
        _KEPT_OBSERVERS.remove(callback)


def selective_context_fn():
    """A fresh pair of (forward, recompute) contexts for one checkpointed call: what
    `checkpoint(..., context_fn=...)` expects."""
    return create_selective_checkpoint_contexts(keep_matmuls_policy)


def checkpoint_kwargs(policy: str) -> dict:
    """Keyword arguments for torch.utils.checkpoint.checkpoint under `policy` ("full" or
    "selective"). Non-reentrant always: it works with frozen inputs (LoRA) and keeps
    nothing extra."""
    kwargs = {"use_reentrant": False}
    if policy == "selective":
        kwargs["context_fn"] = selective_context_fn
    return kwargs
