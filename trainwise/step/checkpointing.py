"""Gradient (activation) checkpointing: keep only block inputs, recompute the rest in backward."""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from trainwise.common.errors import InputError


def enable_checkpointing(model: nn.Module) -> nn.Module:
    """Checkpoint every transformer block, using the model's own switch where it has one
    (Hugging Face models), else wrapping each block of the largest ModuleList."""
    base = getattr(model, "get_base_model", lambda: model)()  # see through a peft wrapper
    if getattr(base, "supports_gradient_checkpointing", False):
        switch = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
        # Non-reentrant checkpointing works with frozen inputs (LoRA) and keeps nothing extra.
        switch(gradient_checkpointing_kwargs={"use_reentrant": False}) if switch.__name__ == "gradient_checkpointing_enable" \
            else switch(activation_checkpointing_kwargs={"use_reentrant": False})
        return model
    blocks = largest_module_list(model)
    if blocks is None:
        raise InputError("--grad-ckpt", f"{type(base).__name__} has no repeated blocks to checkpoint")
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return model


def largest_module_list(model: nn.Module) -> nn.ModuleList | None:
    """The transformer blocks: the longest ModuleList of the model (None without one)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return max(lists, key=len) if lists else None
