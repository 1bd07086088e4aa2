"""Text documents from local data (engine/data/records.py reads the files): a .txt file is
one document, kept verbatim (line breaks included); .jsonl, .csv, .parquet and saved
datasets give one document per record, its text in `--text-field`.

A record whose text is missing or blank is bad data, named by file and row (exit 2): a
corpus with holes is more often a wrong field or a broken export than intended."""

from __future__ import annotations

from trainwise.common.errors import InputError
from trainwise.engine.data.records import load_records


def read_documents(source: str, text_field: str, split: str = "train") -> list[str]:
    """The text documents of `source`, in file order (files sorted by path)."""
    records = load_records(source, split)
    dataset = records.dataset
    field = "text" if records.kind == "text" else text_field
    if field not in dataset.column_names:
        raise InputError("--text-field", f"{source} has no field {field!r}; its fields: "
                                         f"{', '.join(dataset.column_names)}")
    documents = dataset[field]
    for index, text in enumerate(documents):
        if not isinstance(text, str) or not text.strip():
            kind = "no text" if not isinstance(text, str) else "blank text"
            raise InputError("--data", f"{records.where(index)} has {kind} in {field!r}; remove or fill such rows")
    return documents
