"""A model whose loss turns NaN from its third forward on: what the non-finite-loss tests train."""

from __future__ import annotations

import torch
from torch import nn


class DivergesAtThirdStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        loss = (self.weight * x).sum()
        return loss * float("nan") if self.calls >= 3 else loss
