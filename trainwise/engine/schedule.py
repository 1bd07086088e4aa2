"""Learning-rate schedule: linear warm-up, then cosine / linear decay to zero, or constant."""

from __future__ import annotations

import math

import torch


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Factor applied to the peak learning rate before optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}")


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int,
                    schedule: str) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR (so its state saves and restores with the checkpoint) for the schedule."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, total_steps, warmup_steps, schedule))
