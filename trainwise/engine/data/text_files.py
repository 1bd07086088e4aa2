"""Documents from local files through `datasets`: .txt (one document per line), .jsonl
(a text field) and .parquet, or a directory of them. Never touches the Hub."""

from __future__ import annotations

import os
from pathlib import Path

from trainwise.plan.errors import InputError

BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def read_documents(source: str, text_field: str) -> list[str]:
    """The text documents of `source`; InputError('--data') when there are none to read."""
    files = _data_files(source)
    builder = BUILDERS[files[0].suffix]
    if any(BUILDERS[f.suffix] != builder for f in files):
        raise InputError("--data", f"{source} mixes file types; use one of .txt, .jsonl or .parquet")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from datasets import load_dataset

    try:
        dataset = load_dataset(builder, data_files=[str(f) for f in files], split="train")
    except Exception as err:  # noqa: BLE001 - the datasets library raises many kinds
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError("--data", f"cannot read {source}: {first}") from None
    field = "text" if builder == "text" else text_field
    if field not in dataset.column_names:
        raise InputError("--text-field", f"{source} has no field {field!r}; fields: {', '.join(dataset.column_names)}")
    return [text for text in dataset[field] if isinstance(text, str) and text.strip()]


def _data_files(source: str) -> list[Path]:
    path = Path(source).expanduser()
    allowed = ", ".join(BUILDERS)
    if path.is_file():
        if path.suffix not in BUILDERS:
            raise InputError("--data", f"{source}: unsupported file type {path.suffix or '(none)'}; allowed: {allowed}")
        return [path]
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in BUILDERS)
        if not files:
            raise InputError("--data", f"{source} holds no {allowed} files")
        return files
    raise InputError("--data", f"no such file or directory: {source} (or use builtin / synthetic)")
