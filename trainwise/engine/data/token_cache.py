"""A corpus of files tokenized once, in several processes, into a memory-mapped token file.

`datasets.Dataset.map(batched=True, num_proc=N)` tokenizes the records (the Arrow files are
memory-mapped, so the text never has to fit in memory), each document followed by the
end-of-document id; the ids are then appended, a bounded batch at a time, to one flat
int32 file in the trainwise cache ($TRAINWISE_CACHE, else ~/.cache/trainwise; tokens/),
named by the records' fingerprint, the text field and the tokenizer, and written
atomically (a temporary name, then a rename). Training reads that file memory-mapped:
packing cuts it into rows without copying it (packing.py), so a corpus larger than memory
trains, and a second run on the same data and tokenizer tokenizes nothing.

The ids are the ones `ByteTokenizer.stream` / `LocalTokenizer.stream` give for the same
documents (tests/test_token_cache.py holds them equal), so the batches are the same.
A file read by line (records.py) gets the end id after its last line only: with byte
tokens its ids equal the whole file's; a tokenizer sees each line on its own, so no token
spans a line break (tests/test_data_bounded.py)."""

from __future__ import annotations

import bisect
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainwise.common.cache_dir import user_cache_dir
from trainwise.common.errors import InputError

WRITE_BATCH = 10_000  # documents read back from the tokenized Arrow files at a time
PARALLEL_ABOVE_BYTES = 64 * 1024 * 1024  # below this much text, one tokenizing process is fastest
MAX_AUTO_WORKERS = 8


@dataclass(frozen=True)
class TokenizedCorpus:
    """The corpus' token ids (int32, memory-mapped), its size, and whether it was read from
    the cache (True) or tokenized by this run."""

    stream: torch.Tensor
    documents: int
    text_bytes: int
    cached: bool
    workers: int


def tokenizer_workers(requested: int, files: list[Path]) -> int:
    """Processes that tokenize: `requested`, or with 0 one per core (up to 8) for more than
    64 MB of text, else 1."""
    if requested > 0:
        return requested
    size = sum(f.stat().st_size for f in files if f.is_file())
    return min(os.cpu_count() or 1, MAX_AUTO_WORKERS) if size > PARALLEL_ABOVE_BYTES else 1


def tokenized_corpus(dataset, field: str, tokenizer, workers: int, cache_dir: Path | None = None,
                     document_ends: tuple[int, ...] | None = None) -> TokenizedCorpus:
    """The token ids of `dataset[field]`, every document followed by `tokenizer.eos_id`.
    `document_ends`: the rows that end a document (Records.document_ends), when rows are
    lines of larger documents; None: every row is a document."""
    directory = cache_dir or default_token_cache_dir()
    path = directory / f"{_key(dataset, field, tokenizer, document_ends)}.int32"
    summary = path.with_suffix(".json")
    if path.is_file() and summary.is_file():
        documents, text_bytes = (int(v) for v in summary.read_text().split())
        return TokenizedCorpus(_mapped(path), documents, text_bytes, cached=True, workers=0)
    encode = _Encoder(tokenizer, field, document_ends)
    tokenized = dataset.map(encode, batched=True, batch_size=1000, num_proc=workers if workers > 1 else None,
                            with_indices=document_ends is not None,
                            remove_columns=dataset.column_names, desc=f"tokenizing ({workers} process"
                                                                      f"{'es' if workers > 1 else ''})")
    text_bytes = _write(tokenized, path)
    documents = len(tokenized) if document_ends is None else len(document_ends)
    summary_tmp = summary.with_suffix(".json.tmp")
    summary_tmp.write_text(f"{documents} {text_bytes}")
    summary_tmp.replace(summary)  # written last: a token file without it is not trusted
    return TokenizedCorpus(_mapped(path), documents, text_bytes, cached=False, workers=workers)


def default_token_cache_dir() -> Path:
    return user_cache_dir() / "tokens"


class _Encoder:
    """The batched map function: ids of each row plus the end id where the row ends a
    document, and its UTF-8 size. A class (not a closure) so datasets can hash it for its
    cache and pickle it to workers. With `document_ends`, datasets passes each row's index
    in the whole dataset (also in a worker's shard), which says whether the row ends one."""

    def __init__(self, tokenizer, field: str, document_ends: tuple[int, ...] | None = None):
        self.tokenizer, self.field, self.document_ends = tokenizer, field, document_ends

    def __call__(self, batch: dict, indices: list[int] | None = None) -> dict:
        texts = batch[self.field]
        end = [] if self.tokenizer.eos_id is None else [self.tokenizer.eos_id]
        ids = self.tokenizer.encode_batch(texts)
        if indices is None:
            ids = [row + end for row in ids]
        else:
            ids = [row + end if self._ends_document(index) else row for row, index in zip(ids, indices)]
        return {"ids": ids, "bytes": [len(text.encode("utf-8")) for text in texts]}

    def _ends_document(self, index: int) -> bool:
        position = bisect.bisect_left(self.document_ends, index)
        return position < len(self.document_ends) and self.document_ends[position] == index


def _write(tokenized, path: Path) -> int:
    """Append the ids to `path` (atomically) a batch at a time; the text's UTF-8 bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    text_bytes = 0
    with open(temporary, "wb") as out:
        for batch in tokenized.iter(batch_size=WRITE_BATCH):
            ids = [np.asarray(doc, dtype=np.int64) for doc in batch["ids"]]
            flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
            if len(flat) and (flat.max() > np.iinfo(np.int32).max or flat.min() < 0):
                raise InputError("--tokenizer", "gives token ids outside 0..2^31-1")
            out.write(flat.astype(np.int32).tobytes())
            text_bytes += sum(batch["bytes"])
    temporary.replace(path)
    return text_bytes


def _mapped(path: Path) -> torch.Tensor:
    if path.stat().st_size == 0:
        return torch.zeros(0, dtype=torch.int32)
    # Copy-on-write: a view the training never writes, and the file never changes.
    return torch.from_numpy(np.memmap(path, dtype=np.int32, mode="c"))


def _key(dataset, field: str, tokenizer, document_ends: tuple[int, ...] | None = None) -> str:
    """The records' fingerprint (datasets changes it when the files change), the field, the
    tokenizer (its vocabulary and settings, hashed by datasets) and, for rows read by line,
    where documents end (absent otherwise, so the keys of earlier token files still hold)."""
    from datasets.fingerprint import Hasher

    parts = [dataset._fingerprint, field, tokenizer.name, Hasher.hash(tokenizer.identity())]
    if document_ends is not None:
        parts.append(Hasher.hash(document_ends))
    text = "|".join(parts)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
