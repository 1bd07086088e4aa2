"""Every random-number generator a training step draws from, captured and restored so a
resumed run draws the same dropout masks and data-order numbers as an uninterrupted one.

The states are stored as tensors, numbers and lists only, so `torch.load(weights_only=True)`
reads them back (numpy's key array becomes an int64 tensor; python's state tuple a list).
"""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_states() -> dict:
    """torch CPU, every CUDA device (when CUDA has been used), python `random`, numpy."""
    version, internal, gauss = random.getstate()
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    # A process that never touched CUDA drew nothing from it; asking would start a context.
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return {"torch": torch.get_rng_state(),
            "cuda": cuda,
            "python": [version, list(internal), gauss],
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss),
                      float(cached_gaussian)]}


def set_rng_states(states: dict) -> None:
    """Restore what `rng_states` captured. CUDA states go to as many devices as both the
    saving and this process have."""
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda") or []
    if cuda and torch.cuda.is_available():
        for index, state in enumerate(cuda[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, index)
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
