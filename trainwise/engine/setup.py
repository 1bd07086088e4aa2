"""TrainingSetup: what the training loop runs, as engine/parallelize.py builds it from a
Plan and a model (the loop, the checkpoints and the export read its fields)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from trainwise.engine.parallel.mesh import Distributed
from trainwise.techniques.precision import PrecisionPolicy


@dataclass
class TrainingSetup:
    """What the loop runs. `model` is the module whose weights are saved; `forward` is
    what the loop calls (the compiled or DDP-wrapped module, else `model` itself). In a
    distributed run `distributed` says where this rank is; under pipeline parallel,
    `pipeline` runs the step and `model` holds this rank's stages."""

    model: nn.Module
    forward: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    policy: PrecisionPolicy
    device: torch.device
    distributed: Distributed | None = None
    pipeline: object | None = None
    loss_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    @property
    def has_mesh(self) -> bool:
        """Whether the run goes through torch.distributed (collectives, sharded checkpoints)."""
        return self.distributed is not None and self.distributed.has_mesh
