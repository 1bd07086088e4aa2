"""Gradient accumulation: several micro-batches, one optimizer step.

Each micro-batch's loss is divided by the number of micro-batches, so the accumulated
gradient is the gradient of the mean loss, as one large batch would give. Data-parallel
wrappers must not all-reduce gradients until the last micro-batch: `gradient_sync`
turns their sync off for the others (DDP `no_sync`, FSDP2 `set_requires_gradient_sync`).
"""

from __future__ import annotations

import contextlib

from torch import nn


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool):
    """Within the block, gradients are (enabled) or are not (disabled) synchronised
    across data-parallel ranks. A no-op for a single-device model."""
    if enabled:
        yield
        return
    if hasattr(model, "no_sync"):  # DistributedDataParallel
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 fully_shard
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def micro_batch_loss_scale(grad_accum: int) -> float:
    """What each micro-batch's loss is multiplied by before backward."""
    return 1.0 / grad_accum
