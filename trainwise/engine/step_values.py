"""Reading steps' outcomes back from the device, several steps at a time.

A training step leaves its loss, gradient norm, skip flag and loss scale on the device
(train_step.StepOutcome): reading one waits for every kernel queued before it, so the loop
reads them only when it needs a number (a logged step, an evaluation, a checkpoint, the
end of the run or a stop signal), all the steps since the last read together, with one
device-to-host copy per device."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainwise.engine.train_step import StepOutcome


@dataclass(frozen=True)
class StepValues:
    """One step's outcome as numbers. loss: mean unscaled loss; lr: learning rate the step
    used; grad_norm: total norm before clipping (None when not clipping, skipped, or not
    finite); skipped: no parameter update was made; loss_scale: the fp16 scale (None
    without fp16)."""

    loss: float
    lr: float
    grad_norm: float | None
    skipped: bool
    loss_scale: float | None


def read_outcomes(outcomes: list[StepOutcome]) -> list[StepValues]:
    """The values of `outcomes`, in order: one copy per device they lie on."""
    rows: list[list[float | None]] = [[None] * 4 for _ in outcomes]
    by_device: dict[torch.device, list[tuple[int, int, torch.Tensor]]] = {}
    for index, outcome in enumerate(outcomes):
        fields = (outcome.loss, outcome.grad_norm, outcome.skipped, outcome.loss_scale)
        for column, value in enumerate(fields):
            if isinstance(value, torch.Tensor):
                by_device.setdefault(value.device, []).append((index, column, value))
            else:
                rows[index][column] = value
    for tensors in by_device.values():
        # float64 holds every float32/bf16/fp16 value and a bool exactly. One copy to the
        # host; the numbers are then taken from host memory.
        host = torch.stack([t.detach().reshape(()).double() for _, _, t in tensors]).cpu()
        numbers = [float(number) for number in host]
        for (index, column, _), number in zip(tensors, numbers):
            rows[index][column] = number
    return [_values(outcome, row) for outcome, row in zip(outcomes, rows)]


def _values(outcome: StepOutcome, row: list) -> StepValues:
    loss, grad_norm, skipped, loss_scale = row
    skipped = bool(skipped)
    if skipped or (grad_norm is not None and not math.isfinite(grad_norm)):
        grad_norm = None
    return StepValues(float(loss), outcome.lr, grad_norm, skipped, loss_scale)
