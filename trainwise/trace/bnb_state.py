"""What bitsandbytes' 8-bit AdamW allocates, reproduced on fake tensors.

bitsandbytes kernels only run on a GPU, so the tracer stands in an optimizer that creates
the same state bnb's `Optimizer8bit.init_state` creates (bitsandbytes 0.4x): for tensors
with at least `min_8bit_size` (4096) elements, two uint8 moment tensors plus one fp32
absmax per 256-element block for each; smaller tensors keep two fp32 moments. The update
itself is an in-place fused kernel, so it allocates nothing further."""

from __future__ import annotations

import math

import torch

MIN_8BIT_SIZE = 4096
BLOCK_SIZE = 256


class AdamW8bitStateModel(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(_initial_state(p))
        return None


def _initial_state(p: torch.Tensor) -> dict:
    if p.numel() < MIN_8BIT_SIZE:
        return {"state1": torch.zeros_like(p, dtype=torch.float32),
                "state2": torch.zeros_like(p, dtype=torch.float32)}
    blocks = math.ceil(p.numel() / BLOCK_SIZE)
    return {"state1": torch.zeros_like(p, dtype=torch.uint8),
            "state2": torch.zeros_like(p, dtype=torch.uint8),
            "absmax1": torch.zeros(blocks, dtype=torch.float32, device=p.device),
            "absmax2": torch.zeros(blocks, dtype=torch.float32, device=p.device)}
