"""A `datasets.Dataset` the caller already tokenized, as the Trainer takes one: its rows
become micro-batches of `plan.batch_size`, in the same seeded, resumable order as trainwise's
own data (order.py).

Columns read: `input_ids` (required), `labels` (per-token ids, -100 where no loss) or
`label`/`labels` (one class per row, for classification), `attention_mask` when the model
takes one. A row longer than `--seq-len` is cut to it (counted and said in the data line);
a batch of shorter rows is right-padded to its longest row (a multiple of 8), with the
padding masked out of attention and loss. Without a labels column a causal LM learns the
inputs (the model shifts them); other tasks need one."""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

from trainwise.common.errors import InputError
from trainwise.engine.data.order import MicroBatchOrder
from trainwise.engine.data.train_data import TrainData
from trainwise.models import ModelSpec

IGNORE_INDEX = -100
PAD_MULTIPLE = 8
MAX_HELD_OUT_SHARE = 0.10


def is_hf_dataset(data) -> bool:
    """True for a `datasets.Dataset` (checked without importing datasets when it is not loaded)."""
    import sys

    module = sys.modules.get("datasets")
    return module is not None and isinstance(data, module.Dataset)


def user_dataset_data(dataset, spec: ModelSpec | None, plan, run, rank: int, world_size: int) -> TrainData:
    """TrainData over `dataset`; InputError naming `data` for what cannot be trained on."""
    columns = set(dataset.column_names)
    if plan.packing == "documents":
        raise InputError("--packing", "documents packs a token stream; these rows (a Dataset, or --chat "
                                      "conversations) train one per row, padded, so attention never crosses them: "
                                      "drop --packing documents")
    if "input_ids" not in columns:
        raise InputError("data", f"the Dataset has no input_ids column (columns: {', '.join(sorted(columns))}); "
                                 "tokenize it first, as for the Trainer")
    task = spec.task if spec else None
    per_token_labels = "labels" in columns and _is_sequence(dataset[0]["labels"])
    class_column = next((c for c in ("label", "labels") if c in columns and not _is_sequence(dataset[0][c])), None)
    if task not in (None, "causal-lm") and not (per_token_labels or class_column):
        raise InputError("data", f"a {task} model needs a labels (or label) column; the Dataset has "
                                 f"{', '.join(sorted(columns))}")
    held = _held_out_rows(len(dataset), run, plan.batch_size)
    if run.eval_every and held == 0:
        raise InputError("--eval-every", f"the Dataset's {len(dataset)} rows leave none to hold out for evaluation "
                                         f"(up to {MAX_HELD_OUT_SHARE:.0%} are); drop --eval-every or give more rows")
    train_rows = len(dataset) - held
    if train_rows < plan.batch_size * world_size:
        raise InputError("data", f"the Dataset has {len(dataset):,} rows ({held} held out for --eval-every): too few "
                                 f"for {world_size} micro-batch(es) of {plan.batch_size}")
    with_mask = "attention_mask" in columns or (spec is not None and _takes_mask(spec))
    rows = _RowReader(dataset, plan.seq_len, per_token_labels, class_column, with_mask)
    order = MicroBatchOrder(train_rows, plan.batch_size, run.seed, rank, world_size)
    lengths = [min(len(ids), plan.seq_len) for ids in dataset["input_ids"]]
    cut = sum(len(ids) > plan.seq_len for ids in dataset["input_ids"])
    mean_tokens = sum(lengths[:train_rows]) / train_rows
    held_out = list(range(train_rows, len(dataset)))
    description = (f"a datasets.Dataset of {len(dataset):,} tokenized rows ({train_rows:,} trained on, {held} held "
                   f"out), {mean_tokens:.0f} tokens per row on average" +
                   (f"; {cut:,} row(s) longer than --seq-len {plan.seq_len} cut to it" if cut else ""))
    return TrainData(_Batches(rows, order),
                     lambda n: [rows.batch(held_out[s:s + plan.batch_size])
                                for s in range(0, len(held_out), plan.batch_size)][:n],
                     description=description, tokens_per_micro_batch=round(plan.batch_size * mean_tokens),
                     micro_batches_per_epoch=order.per_epoch, workers=plan.workers, pin_memory=plan.pin_memory,
                     seed=run.seed)


class _RowReader:
    """Rows of the dataset -> one padded micro-batch dict."""

    def __init__(self, dataset, seq_len: int, per_token_labels: bool, class_column: str | None, with_mask: bool):
        self.dataset, self.seq_len = dataset, seq_len
        self.per_token_labels, self.class_column, self.with_mask = per_token_labels, class_column, with_mask

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        rows = self.dataset[[int(i) for i in indices]]
        ids = [list(r)[:self.seq_len] for r in rows["input_ids"]]
        width = max(len(r) for r in ids)
        width = width if width == self.seq_len else min(self.seq_len, math.ceil(width / PAD_MULTIPLE) * PAD_MULTIPLE)
        real = torch.zeros(len(ids), width, dtype=torch.bool)
        input_ids = torch.zeros(len(ids), width, dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            real[i, :len(row)] = True
        batch = {"input_ids": input_ids}
        if self.with_mask:
            batch["attention_mask"] = real.long()
        if self.per_token_labels:
            labels = torch.full((len(ids), width), IGNORE_INDEX, dtype=torch.long)
            for i, row in enumerate(rows["labels"]):
                row = list(row)[:width]
                labels[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            batch["labels"] = labels.masked_fill(~real, IGNORE_INDEX)
        elif self.class_column:
            batch["labels"] = torch.tensor(rows[self.class_column], dtype=torch.long)
        else:
            batch["labels"] = input_ids.masked_fill(~real, IGNORE_INDEX)
        return batch


class _Batches(Dataset):
    def __init__(self, rows: _RowReader, order: MicroBatchOrder):
        self.rows, self.order = rows, order

    def __getitem__(self, number: int) -> dict[str, torch.Tensor]:
        return self.rows.batch(self.order.rows(number).tolist())


def _held_out_rows(count: int, run, batch_size: int) -> int:
    if not run.eval_every:
        return 0
    return min(run.eval_batches * batch_size, int(count * MAX_HELD_OUT_SHARE))


def _is_sequence(value) -> bool:
    return isinstance(value, (list, tuple)) or (hasattr(value, "ndim") and value.ndim > 0)


def _takes_mask(spec: ModelSpec) -> bool:
    from trainwise.models import example_batch

    return "attention_mask" in example_batch(spec, 1, 1)
