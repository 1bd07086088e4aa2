"""Which rows micro-batch k of rank r holds: a pure function of (seed, k, rank), so a run
can resume at any micro-batch without replaying the ones before it.

An epoch is one permutation of the training rows, drawn from a generator seeded with
(seed, epoch). Each round of an epoch hands every rank one micro-batch from consecutive
slices of that permutation, so within an epoch no two ranks (and no two micro-batches)
share a row, and all ranks start a new epoch at the same micro-batch number. Rows left
over after the last full round sit out that epoch; the next permutation differs."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

# Independent random streams derived from one user seed.
TRAIN_STREAM = 0  # synthetic training batches
EVAL_STREAM = 1  # synthetic evaluation batches
SHUFFLE_STREAM = 2  # the per-epoch row permutations
LOADER_STREAM = 3  # the DataLoader's own generator (worker base seeds)


def mixed_seed(*parts: int) -> int:
    """One generator seed from several non-negative integers, hashed so that nearby
    tuples such as (seed, 1) and (seed + 1, 0) give unrelated streams."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])  # 63 bits: any torch.Generator accepts it


class MicroBatchOrder:
    """Row indices of each micro-batch of one rank, epoch after epoch."""

    def __init__(self, num_rows: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        if num_rows < batch_size * world_size:
            raise ValueError(f"{num_rows} rows cannot fill {world_size} micro-batches of {batch_size}")
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.per_epoch = num_rows // (batch_size * world_size)  # micro-batches per rank per epoch
        self._cached: tuple[int, torch.Tensor] | None = None  # one permutation, per process

    def rows(self, number: int) -> torch.Tensor:
        """Row indices (int64, `batch_size` of them) of this rank's micro-batch `number`."""
        epoch, round_in_epoch = divmod(number, self.per_epoch)
        first = (round_in_epoch * self.world_size + self.rank) * self.batch_size
        return self._permutation(epoch)[first:first + self.batch_size]

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._cached is None or self._cached[0] != epoch:
            generator = torch.Generator().manual_seed(mixed_seed(self.seed, SHUFFLE_STREAM, epoch))
            self._cached = (epoch, torch.randperm(self.num_rows, generator=generator))
        return self._cached[1]


class CountFrom(Sampler[int]):
    """start, start + 1, start + 2, ... forever: the micro-batch numbers to load."""

    def __init__(self, start: int):
        self.start = start

    def __iter__(self) -> Iterator[int]:
        number = self.start
        while True:
            yield number
            number += 1
