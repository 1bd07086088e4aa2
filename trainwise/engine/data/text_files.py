"""Documents from local files, read through `datasets`: .txt, .jsonl/.json (one object
per line, text in `--text-field`) and .parquet, or a directory holding one of those kinds.

A .txt file is one document, kept verbatim (line breaks included); .jsonl and .parquet
give one document per record. Only local files are read: `datasets` is told never to
reach the network."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from trainwise.common.errors import InputError, first_line

BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
ALLOWED = "builtin, synthetic, or a .txt, .jsonl or .parquet file or a directory of them"


def read_documents(source: str, text_field: str) -> list[str]:
    """The non-blank text documents of `source`, in file order (files sorted by path)."""
    files = data_files(source)
    builder = BUILDERS[files[0].suffix]
    if any(BUILDERS[f.suffix] != builder for f in files):
        raise InputError("--data", f"{source} mixes file kinds; a directory must hold only .txt, only "
                                   ".jsonl or only .parquet files")
    import datasets

    options = {"sample_by": "document"} if builder == "text" else {}
    try:
        with _quiet_progress(datasets):
            dataset = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train",
                                            download_config=datasets.DownloadConfig(local_files_only=True),
                                            **options)
    except Exception as err:  # noqa: BLE001 - datasets and pyarrow raise many kinds
        raise InputError("--data", f"cannot read {source} as {builder} ({first_line(err)}); "
                                   "text must be UTF-8, .jsonl one JSON object per line") from None
    field = "text" if builder == "text" else text_field
    if field not in dataset.column_names:
        raise InputError("--text-field", f"{source} has no field {field!r}; its fields: "
                                         f"{', '.join(dataset.column_names)}")
    return [text for text in dataset[field] if isinstance(text, str) and text.strip()]


def data_files(source: str) -> list[Path]:
    """The data files `source` names: itself, or the supported files under a directory."""
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix not in BUILDERS:
            raise InputError("--data", f"{source}: unsupported file type {path.suffix or '(none)'}; "
                                       f"allowed: {ALLOWED}")
        return [path]
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in BUILDERS
                       and not any(part.startswith(".") for part in f.relative_to(path).parts))
        if not files:
            raise InputError("--data", f"{source} holds no .txt, .jsonl or .parquet files; allowed: {ALLOWED}")
        return files
    raise InputError("--data", f"no such file or directory: {source}; allowed: {ALLOWED}")


@contextlib.contextmanager
def _quiet_progress(datasets) -> Iterator[None]:
    """Hide datasets' progress bars while it reads (training prints its own progress)."""
    were_enabled = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if were_enabled:
            datasets.enable_progress_bars()
