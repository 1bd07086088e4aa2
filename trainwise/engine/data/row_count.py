"""How many training sequences `--data` packs into, when that is cheap to know before any
tokenizing: `train --plan auto` bounds its micro-batch by it before the search, so a small
dataset is not refused after a search that chose more rows than it has."""

from __future__ import annotations

from pathlib import Path

from trainwise.engine.data.records import data_files

# A larger .txt is not read to count its lines: it packs into far more sequences than a
# default batch takes, and counting would cost seconds before the search.
COUNTED_BYTES = 64 * 2**20


def rows_at_least(data: str, tokenizer: str | None, chat: str | None, seq_len: int) -> int | None:
    """A lower bound on the full training sequences of `seq_len` tokens that `data` packs
    into, or None when it is not cheap to know (synthetic data has no end; a tokenizer's
    token count needs the tokenizing; .jsonl/.csv/.parquet hold more than their text).
    With byte tokens every UTF-8 byte of text is one token and each document adds an end
    id, so the text's bytes (line breaks aside, which a line read drops) bound the tokens
    from below."""
    if tokenizer is not None or chat is not None or data == "synthetic":
        return None
    if data == "builtin":
        from trainwise.engine.data.builtin_corpus import builtin_documents

        return sum(len(d.encode("utf-8")) for d in builtin_documents()) // seq_len
    try:
        files = data_files(data)
    except Exception:  # noqa: BLE001 - the data's own check refuses it, with its message
        return None
    if any(f.suffix != ".txt" for f in files) or sum(f.stat().st_size for f in files) > COUNTED_BYTES:
        return None
    return sum(_text_bytes(f) for f in files) // seq_len


def _text_bytes(file: Path) -> int:
    content = file.read_bytes()
    return len(content) - content.count(b"\n") - content.count(b"\r")
