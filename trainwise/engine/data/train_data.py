"""TrainData: micro-batches for the loop, through a DataLoader, from any position.

Each DataLoader item is a whole micro-batch (its number decides its samples, see
order.py), so workers, pinning and prefetching apply while the order stays exact."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from trainwise.engine.data.order import MicroBatchNumbers, MicroBatchOrder
from trainwise.models import ModelSpec, example_batch
from trainwise.plan.plan import Plan


class _PackedMicroBatches(Dataset):
    """Micro-batch number -> a causal-LM batch of packed sequences."""

    def __init__(self, sequences: torch.Tensor, order: MicroBatchOrder, with_mask: bool):
        self.sequences, self.order, self.with_mask = sequences, order, with_mask

    def __getitem__(self, number: int) -> dict[str, torch.Tensor]:
        return packed_batch(self.sequences[self.order.sample_indices(number)], self.with_mask)


class _SyntheticMicroBatches(Dataset):
    """Micro-batch number -> random tokens drawn from a generator seeded by (seed, number)."""

    def __init__(self, spec: ModelSpec, plan: Plan, seed: int):
        self.spec, self.plan, self.seed = spec, plan, seed

    def __getitem__(self, number: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + number)
        return example_batch(self.spec, self.plan.batch_size, self.plan.seq_len, generator=generator)


def packed_batch(sequences: torch.Tensor, with_mask: bool) -> dict[str, torch.Tensor]:
    """A causal-LM batch: the model shifts the labels itself."""
    batch = {"input_ids": sequences.clone()}
    if with_mask:
        batch["attention_mask"] = torch.ones_like(sequences)
    batch["labels"] = sequences.clone()
    return batch


class TrainData:
    """Micro-batches of `plan.batch_size` x `plan.seq_len` for one rank; see build_data."""

    def __init__(self, dataset: Dataset, eval_source, plan: Plan, description: str, rank: int, world_size: int):
        self._dataset, self._eval_source, self._plan = dataset, eval_source, plan
        self.description, self.rank, self.world_size = description, rank, world_size
        self.tokens_per_micro_batch = plan.batch_size * plan.seq_len

    def micro_batches(self, start: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """Forever, this rank's micro-batch number `start` first (exact resume)."""
        workers = self._plan.workers
        loader = DataLoader(self._dataset, batch_size=None,
                            sampler=MicroBatchNumbers(start, self.rank, self.world_size),
                            num_workers=workers, pin_memory=self._plan.pin_memory and torch.cuda.is_available(),
                            prefetch_factor=2 if workers else None, persistent_workers=workers > 0)
        return iter(loader)

    def eval_batches(self, n: int) -> list[dict[str, torch.Tensor]]:
        return self._eval_source(n)
