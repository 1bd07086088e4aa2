"""Text documents from local data (engine/data/records.py reads the files): a .txt file is
one document, kept verbatim (line breaks included); .jsonl, .csv, .parquet and saved
datasets give one document per record, its text in `--text-field`. A large .txt file is
read one record per line (records.py), and still makes one document.

A record whose text is missing or blank is bad data, named by file and row (exit 2): a
corpus with holes is more often a wrong field or a broken export than intended. In a file
read by line blank lines are part of the text; only a file of nothing but blank lines is
refused, as an empty small file is."""

from __future__ import annotations

from trainwise.common.errors import InputError
from trainwise.engine.data.records import Records, load_records


CHECK_BATCH = 10_000  # records read at a time while checking (memory stays bounded)


def read_documents(source: str, text_field: str, split: str = "train") -> list[str]:
    """The texts of `source`'s records, in file order (files sorted by path), in memory
    (a file read by line gives its lines)."""
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
    with_text: set[int] = set()  # files read by line that hold a non-blank line
    start = 0
    for batch in dataset.select_columns([field]).iter(batch_size=CHECK_BATCH):
        texts = batch[field]
        for number, first, stop in _file_spans(records, start, start + len(texts)):
            if records.is_by_line(number):
                if number not in with_text and any(text.strip() for text in texts[first - start:stop - start]):
                    with_text.add(number)
                continue
            for index in range(first, stop):
                _check_text(texts[index - start], records, index, field)
        start += len(texts)
    blank_files = [records.files[n] for n in range(len(records.files)) if records.is_by_line(n) and n not in with_text]
    if blank_files:
        raise InputError("--data", f"{blank_files[0]} holds only blank lines; remove it or add text")
    return records, field


def _check_text(text, records: Records, index: int, field: str) -> None:
    if not isinstance(text, str) or not text.strip():
        kind = "no text" if not isinstance(text, str) else "blank text"
        raise InputError("--data", f"{records.where(index)} has {kind} in {field!r}; remove or fill such rows")


def _file_spans(records: Records, start: int, stop: int):
    """(file number, first row, end row) of each file's share of rows start..stop."""
    number = records.file_of(start)
    while start < stop:
        end = min(stop, records.file_end(number))
        yield number, start, end
        start, number = end, number + 1
