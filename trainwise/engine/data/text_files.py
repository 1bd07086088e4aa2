"""Text documents from local data (engine/data/records.py reads the files): a .txt file is
one document, kept verbatim (line breaks included); .jsonl, .csv, .parquet and saved
datasets give one document per record, its text in `--text-field`.

A record whose text is missing or blank is bad data, named by file and row (exit 2): a
corpus with holes is more often a wrong field or a broken export than intended."""

from __future__ import annotations

from trainwise.common.errors import InputError
from trainwise.engine.data.records import Records, load_records


CHECK_BATCH = 10_000  # records read at a time while checking (memory stays bounded)


def read_documents(source: str, text_field: str, split: str = "train") -> list[str]:
    """The text documents of `source`, in file order (files sorted by path), in memory."""
    records, field = text_records(source, text_field, split)
    return records.dataset[field]


def text_records(source: str, text_field: str, split: str = "train") -> tuple[Records, str]:
    """(the records of `source`, the field holding their text), every text checked a
    batch at a time (the Arrow files stay memory-mapped)."""
    records = load_records(source, split)
    dataset = records.dataset
    field = "text" if records.kind == "text" else text_field
    if field not in dataset.column_names:
        raise InputError("--text-field", f"{source} has no field {field!r}; its fields: "
                                         f"{', '.join(dataset.column_names)}")
    start = 0
    for batch in dataset.select_columns([field]).iter(batch_size=CHECK_BATCH):
        for offset, text in enumerate(batch[field]):
            if not isinstance(text, str) or not text.strip():
                kind = "no text" if not isinstance(text, str) else "blank text"
                raise InputError("--data", f"{records.where(start + offset)} has {kind} in {field!r}; remove or "
                                           "fill such rows")
        start += len(batch[field])
    return records, field
