"""Which samples micro-batch number g holds: a pure function of (seed, g), so any position
can be resumed without replaying the data before it.

Micro-batches are numbered globally across ranks: rank r of w takes numbers r, r+w,
r+2w, ... so ranks never share a sample within an epoch. Each epoch is a fresh
permutation of the samples, drawn from a generator seeded with (seed, epoch)."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler


class MicroBatchOrder:
    def __init__(self, num_samples: int, batch_size: int, seed: int):
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.per_epoch = num_samples // batch_size
        self._cached: tuple[int, torch.Tensor] | None = None

    def sample_indices(self, number: int) -> torch.Tensor:
        epoch, position = divmod(number, self.per_epoch)
        permutation = self._permutation(epoch)
        return permutation[position * self.batch_size:(position + 1) * self.batch_size]

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._cached is None or self._cached[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._cached = (epoch, torch.randperm(self.num_samples, generator=generator))
        return self._cached[1]


class MicroBatchNumbers(Sampler[int]):
    """The global micro-batch numbers this rank takes, from its `start`-th on, forever."""

    def __init__(self, start: int, rank: int, world_size: int):
        self.start, self.rank, self.world_size = start, rank, world_size

    def __iter__(self) -> Iterator[int]:
        local = self.start
        while True:
            yield local * self.world_size + self.rank
            local += 1
