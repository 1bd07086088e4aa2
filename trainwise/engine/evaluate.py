"""Evaluation on held-out micro-batches, optionally in full half precision.

`same` evaluates the training model under the training autocast. `fp16`/`bf16` evaluate
a half-precision copy of the weights (what `fp16_full_eval` does in the Trainer): it
halves evaluation memory for weights-heavy models and is how models are often served.
The copy costs weights/2 bytes while it lives and is freed after; the training weights
are never cast in place, so the fp32 master copy loses nothing. `fp32` evaluates without
autocast."""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from trainwise.engine.train_step import to_device
from trainwise.techniques import compute_loss

_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


@torch.no_grad()
def evaluate(model: nn.Module, batches: list, device: torch.device, precision: str,
             autocast_dtype: torch.dtype | None) -> float:
    """Mean loss over `batches` (no gradients, dropout off); the model is left in train mode."""
    if not batches:
        return float("nan")
    evaluated = copy.deepcopy(model).to(_HALF[precision]) if precision in _HALF else model
    use_autocast = precision == "same" and autocast_dtype is not None
    evaluated.eval()
    try:
        losses = []
        for batch in batches:
            with torch.autocast(device.type, dtype=autocast_dtype) if use_autocast else contextlib.nullcontext():
                losses.append(compute_loss(evaluated, to_device(batch, device)).float())
        return torch.stack(losses).mean().item()
    finally:
        model.train()
        del evaluated
