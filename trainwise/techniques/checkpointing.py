"""Gradient (activation) checkpointing: keep only block inputs, recompute the rest in backward.

Two knobs shape it: the policy (`full` recomputes a checkpointed block's whole forward;
`selective` keeps its matmul and attention outputs: trainwise/techniques/selective_checkpoint.py)
and `every` (checkpoint blocks 0, k, 2k, ... of each stack; the others keep their
activations, trading memory back for speed)."""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from trainwise.common.errors import InputError
from trainwise.techniques.block_stacks import block_stacks
from trainwise.techniques.selective_checkpoint import checkpoint_kwargs


def enable_checkpointing(model: nn.Module, policy: str = "full", every: int = 1) -> nn.Module:
    """Checkpoint the transformer blocks, using the model's own switch where it has one
    (Hugging Face models), else wrapping the blocks of every stack (techniques/block_stacks.py,
    the blocks the trace prices as checkpointed)."""
    base = getattr(model, "get_base_model", lambda: model)()  # see through a peft wrapper
    if getattr(base, "supports_gradient_checkpointing", False):
        switch = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
        kwargs = checkpoint_kwargs(policy)
        switch(gradient_checkpointing_kwargs=kwargs) if switch.__name__ == "gradient_checkpointing_enable" \
            else switch(activation_checkpointing_kwargs=kwargs)
        if every > 1:
            _keep_activations_between(base, every)
        return model
    stacks = block_stacks(model)
    if not stacks:
        raise InputError("--grad-ckpt", f"{type(base).__name__} has no repeated blocks to checkpoint")
    for _, blocks in stacks:
        for index, block in enumerate(blocks):  # counted within each stack, as the trace counts them
            if index % every == 0:
                wrap_forward(block, policy)
    return model


def _keep_activations_between(model: nn.Module, every: int) -> None:
    """Turn checkpointing off on every block of each stack whose index is not a multiple of
    `every`, through the per-layer switch transformers' blocks carry (`gradient_checkpointing`
    of a GradientCheckpointingLayer). Indices count within each stack, as a config cut to
    fewer blocks keeps the first ones (the estimate traces such cuts)."""
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0
              and all(hasattr(block, "gradient_checkpointing") for block in m)]
    if not stacks:
        raise InputError("--grad-ckpt-every", f"{type(model).__name__}'s blocks have no per-block checkpointing "
                                              "switch; use --grad-ckpt-every 1")
    for stack in stacks:
        for index, block in enumerate(stack):
            block.gradient_checkpointing = index % every == 0


def wrap_forward(block: nn.Module, policy: str) -> None:
    """Checkpoint `block`'s forward (not `__call__`, so module hooks stay outside)."""
    block.forward = functools.partial(checkpoint, block.forward, **checkpoint_kwargs(policy))


def largest_module_list(model: nn.Module) -> nn.ModuleList | None:
    """The longest ModuleList of the model (None without one): one stack's blocks, for the
    per-rank estimate's one-block model (single-stack models only). The blocks the engine
    compiles, shards, checkpoints, offloads and places vertically are every stack's
    (techniques/block_stacks.py)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return max(lists, key=len) if lists else None
