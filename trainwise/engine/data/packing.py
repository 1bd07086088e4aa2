"""Packing a token stream into fixed-length rows, holding some out, and batching rows.

Documents arrive already joined by the end-of-document id, so cutting the stream every
`seq_len` tokens gives full rows with no padding. The last `held_out` full rows and the
stream's partial tail are kept for evaluation and never trained on. Training and held-out
rows are views of the stream (a memory-mapped token file holds it: token_cache.py); only
the tail, at most one row, is copied to be padded. Padding happens
only where it cannot be avoided (a corpus shorter than one row, the evaluation tail):
padded positions get attention_mask 0 and label -100, and a batch of short rows is
trimmed to a multiple of 8 tokens rather than to `seq_len`.

With `--packing documents` the rows are cut the same way, but each batch carries position
ids restarting after every end-of-document id (and at each row start: a document split
across rows restarts at 0 in the next row, as the piece cannot see its beginning anyway)
and no attention_mask, so attention stays inside each document (models/documents.py). A
padded tail counts as one more document, with labels -100."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainwise.models.documents import as_documents

PAD_MULTIPLE = 8  # padded widths round up to this (tensor-core friendly shapes)
IGNORE_INDEX = -100  # label the transformers losses skip
HELD_OUT_SHARE = 0.02  # of the full rows, kept for evaluation ...
MAX_HELD_OUT_SHARE = 0.10  # ... or more when evaluation asks for more, up to this share
MIN_ROW_TOKENS = 2  # a row needs one token to predict from and one to predict


@dataclass(frozen=True)
class Rows:
    """Token rows right-padded to one width: `ids` (rows, width) int64 and `lengths`
    (rows,) int64, the real tokens at the start of each row."""

    ids: torch.Tensor
    lengths: torch.Tensor

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


@dataclass(frozen=True)
class HeldOutRows:
    """The held-out rows: `full` ones (a view of the stream) and then the padded `tail`
    (none or one row). Two parts, so that the full rows never need a padded copy."""

    full: Rows
    tail: Rows

    def __len__(self) -> int:
        return len(self.full) + len(self.tail)

    def rows(self, start: int, stop: int) -> Rows:
        """Rows start..stop of full-then-tail; copied (as int64) only where they span both parts."""
        if stop <= len(self.full):
            return Rows(self.full.ids[start:stop], self.full.lengths[start:stop])
        head, tail = len(self.full), self.tail
        if start >= head:
            return Rows(tail.ids[start - head:stop - head], tail.lengths[start - head:stop - head])
        return Rows(torch.cat([self.full.ids[start:].long(), tail.ids[:stop - head]]),
                    torch.cat([self.full.lengths[start:], tail.lengths[:stop - head]]))


@dataclass(frozen=True)
class PackedCorpus:
    """A corpus cut into rows: `train` (what the model learns from) and `held_out`."""

    train: Rows
    held_out: HeldOutRows


def pack(stream: torch.Tensor, seq_len: int, pad_id: int, train_rows_needed: int,
         held_out_rows_wanted: int) -> PackedCorpus:
    """Cut `stream` (int64, or int32 from a token file: engine/data/token_cache.py) into
    rows of `seq_len` tokens; the training and full held-out rows are views of it, not copies.

    Holds out about HELD_OUT_SHARE of the full rows (at least `held_out_rows_wanted`, at
    most MAX_HELD_OUT_SHARE, never leaving fewer than `train_rows_needed` to train on).
    A stream shorter than one row becomes a single padded training row.
    """
    full = len(stream) // seq_len
    if full == 0:
        return PackedCorpus(train=_padded([stream], seq_len, pad_id),
                            held_out=HeldOutRows(_padded([], seq_len, pad_id), _padded([], seq_len, pad_id)))
    held = min(max(math.ceil(full * HELD_OUT_SHARE), held_out_rows_wanted),
               max(1, int(full * MAX_HELD_OUT_SHARE)), max(0, full - train_rows_needed))
    sequences = stream[:full * seq_len].view(full, seq_len)
    tail = stream[full * seq_len:]
    return PackedCorpus(train=_full_rows(sequences[:full - held]),
                        held_out=HeldOutRows(_full_rows(sequences[full - held:]),
                                             _padded([tail] if len(tail) >= MIN_ROW_TOKENS else [], seq_len, pad_id)))


def _full_rows(ids: torch.Tensor) -> Rows:
    return Rows(ids, torch.full((len(ids),), ids.shape[1], dtype=torch.long))


def _padded(rows: list[torch.Tensor], width: int, pad_id: int) -> Rows:
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return Rows(ids, torch.tensor([len(row) for row in rows], dtype=torch.long))


def causal_lm_batch(ids: torch.Tensor, lengths: torch.Tensor, with_mask: bool,
                    document_end: int | None = None) -> dict[str, torch.Tensor]:
    """A causal-LM micro-batch from padded rows: labels are the inputs (the model shifts
    them itself), with padding masked out. Full rows come back exactly `seq_len` wide.
    `document_end`: the end-of-document id, to pack documents (--packing documents)."""
    width = _batch_width(int(lengths.max()), ids.shape[1])
    ids = ids[:, :width].to(torch.long, copy=True)  # never a view of the corpus (an int32 token file)
    real = torch.arange(width) < lengths[:, None]
    if document_end is not None:
        return as_documents(ids, ids.masked_fill(~real, IGNORE_INDEX), _document_starts(ids, lengths, document_end))
    batch = {"input_ids": ids}
    if with_mask:
        batch["attention_mask"] = real.long()
    batch["labels"] = ids.masked_fill(~real, IGNORE_INDEX)
    return batch


def _document_starts(ids: torch.Tensor, lengths: torch.Tensor, document_end: int) -> torch.Tensor:
    """True at each token that follows an end-of-document id, and at the first padding."""
    starts = torch.zeros_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, :-1] == document_end
    starts |= torch.arange(ids.shape[1]) == lengths[:, None]
    return starts


def _batch_width(longest: int, seq_len: int) -> int:
    if longest == seq_len:
        return seq_len
    return min(seq_len, math.ceil(longest / PAD_MULTIPLE) * PAD_MULTIPLE)


def held_out_batches(rows: HeldOutRows, batch_size: int, count: int, with_mask: bool,
                     document_end: int | None = None) -> list[dict[str, torch.Tensor]]:
    """Up to `count` micro-batches of `batch_size` held-out rows, in corpus order (the
    last one may hold fewer rows); `document_end` as in causal_lm_batch."""
    batches = []
    for start in range(0, len(rows), batch_size)[:count]:
        chosen = rows.rows(start, min(start + batch_size, len(rows)))
        batches.append(causal_lm_batch(chosen.ids, chosen.lengths, with_mask, document_end))
    return batches
