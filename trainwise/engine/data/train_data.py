"""TrainData: one rank's micro-batches for the training loop, from any position.

Each DataLoader item is a whole micro-batch whose content depends only on its number
(see order.py), so worker processes, pinned memory and prefetching change how fast
batches arrive but never which batches arrive, and resuming at number k needs no replay."""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from trainwise.engine.data.order import LOADER_STREAM, TRAIN_STREAM, CountFrom, MicroBatchOrder, mixed_seed
from trainwise.engine.data.packing import Rows, causal_lm_batch
from trainwise.models import ModelSpec, example_batch

PREFETCH_PER_WORKER = 2  # micro-batches each worker keeps ready


class PackedMicroBatches(Dataset):
    """Micro-batch number -> a causal-LM batch of packed training rows."""

    def __init__(self, rows: Rows, order: MicroBatchOrder, with_mask: bool, document_end: int | None = None):
        self.rows, self.order, self.with_mask, self.document_end = rows, order, with_mask, document_end

    def __getitem__(self, number: int) -> dict[str, torch.Tensor]:
        chosen = self.order.rows(number)
        return causal_lm_batch(self.rows.ids[chosen], self.rows.lengths[chosen], self.with_mask, self.document_end)


class SyntheticMicroBatches(Dataset):
    """Micro-batch number -> random tokens from a generator seeded by (seed, number), for
    any task. Rank r of w draws the numbers r, r + w, r + 2w, ... of one shared sequence.
    `documents`: rows cut into random-length packed documents (--packing documents).
    `distinct` > 0: only the first `distinct` numbers of the sequence are drawn, then they
    repeat (--synthetic-batches: a fixed set the model can fit)."""

    def __init__(self, spec: ModelSpec, batch_size: int, seq_len: int, seed: int, rank: int, world_size: int,
                 documents: bool = False, distinct: int = 0):
        self.spec, self.batch_size, self.seq_len, self.seed = spec, batch_size, seq_len, seed
        self.rank, self.world_size, self.documents, self.distinct = rank, world_size, documents, distinct

    def __getitem__(self, number: int) -> dict[str, torch.Tensor]:
        index = number * self.world_size + self.rank
        return self.batch(mixed_seed(self.seed, TRAIN_STREAM, index % self.distinct if self.distinct else index))

    def batch(self, generator_seed: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(generator_seed)
        return example_batch(self.spec, self.batch_size, self.seq_len, generator=generator, documents=self.documents)


class TrainData:
    """Micro-batches of one rank, as build_data makes them.

    description              one line for the user: source, tokens, corpus size
    tokens_per_micro_batch   real (unpadded) tokens in one training micro-batch
    micro_batches_per_epoch  micro-batches per rank before the data repeats in a new
                             order; None for synthetic data, which never repeats
    seed                     the run's seed, for the loader's own generator
    """

    def __init__(self, dataset: Dataset, eval_source: Callable[[int], list], *, description: str,
                 tokens_per_micro_batch: int, micro_batches_per_epoch: int | None, workers: int, pin_memory: bool,
                 seed: int = 0):
        self._dataset, self._eval_source = dataset, eval_source
        self.description = description
        self.tokens_per_micro_batch = tokens_per_micro_batch
        self.micro_batches_per_epoch = micro_batches_per_epoch
        self._workers, self._pin_memory, self._seed = workers, pin_memory, seed

    def micro_batches(self, start: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's micro-batches forever, number `start` first: what an uninterrupted
        iterator yields from its `start`-th item on. CPU tensors (pinned with pin_memory).

        Starting a DataLoader iterator draws a base seed for its workers. From the global
        generator that draw would land after a resumed run restored its RNG state, and shift
        every dropout mask after it; the loader's own generator leaves the global one alone."""
        if start < 0:
            raise ValueError(f"micro-batch numbers start at 0, got {start}")
        own = torch.Generator().manual_seed(mixed_seed(self._seed, LOADER_STREAM))
        loader = DataLoader(self._dataset, batch_size=None, sampler=CountFrom(start), num_workers=self._workers,
                            generator=own,
                            pin_memory=self._pin_memory and torch.cuda.is_available(),
                            prefetch_factor=PREFETCH_PER_WORKER if self._workers else None,
                            persistent_workers=self._workers > 0)
        return iter(loader)

    def eval_batches(self, n: int) -> list[dict[str, torch.Tensor]]:
        """Up to `n` fixed held-out micro-batches, the same on every rank and every call;
        fewer when the held-out text is shorter. File and builtin data never train on them."""
        return self._eval_source(n)
