"""Local data files (or a `save_to_disk` directory) read through `datasets` as records,
each remembered with the file and row it came from, so bad data is named where it is.

`--data` may be a file (.txt, .jsonl/.json, .csv, .parquet), a directory of one kind of
them, a glob (`data/*.jsonl`), or a directory written by `Dataset.save_to_disk` /
`DatasetDict.save_to_disk` (then `--data-split` picks the split; default train). Only local
files are read: `datasets` never reaches the network; its Arrow files are memory-mapped.

A .txt file is one record (its whole text), unless it is larger than LINE_RECORDS_ABOVE_BYTES:
then it is one record per line, line breaks kept, so that reading and tokenizing it never
holds the whole text in memory. Either way the file stays one document (`document_ends`)."""

from __future__ import annotations

import bisect
import contextlib
import glob
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from trainwise.common.errors import InputError, first_line

BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
ALLOWED = ("builtin, synthetic, a .txt, .jsonl, .csv or .parquet file, a directory or glob of them, "
           "or a save_to_disk directory")
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
# Read whole, a .txt file sits in memory several times over while it is tokenized (the
# text, then its ids as Python and Arrow lists: a 40 MB file peaked at 2.4 GB RSS,
# benchmarks/data_memory.py). Above this size it is read line by line instead; below it,
# one record per file is the faster read and tokenizes exactly as the whole text would (no
# token is cut at a line break). 8 MiB bounds the whole-file cost to some 0.5 GB (~60x).
LINE_RECORDS_ABOVE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Records:
    """The rows of `source` (a datasets.Dataset) and, per row, where it came from."""

    source: str
    kind: str  # the datasets builder (text, json, csv, parquet), or "saved"
    dataset: object
    files: tuple[str, ...]
    # The index of each file's first row: one number per file rather than one per row,
    # as a file read by line holds millions of rows.
    file_starts: tuple[int, ...]
    by_line: tuple[bool, ...] = ()  # per file: one row per line (a large .txt file)

    def file_of(self, index: int) -> int:
        """The number (index into files) of the file row `index` came from."""
        return bisect.bisect_right(self.file_starts, index) - 1

    def file_end(self, number: int) -> int:
        """One past the last row of file `number`."""
        return self.file_starts[number + 1] if number + 1 < len(self.files) else len(self.dataset)

    def is_by_line(self, number: int) -> bool:
        return bool(self.by_line) and self.by_line[number]

    def where(self, index: int) -> str:
        number = self.file_of(index)
        unit = "line" if self.is_by_line(number) else "row"
        return f"{self.files[number]} {unit} {index - self.file_starts[number] + 1}"

    def document_ends(self) -> tuple[int, ...] | None:
        """The rows that end a document (the last line of each file) when a file is read
        by line; None when every row is a document of its own."""
        if not any(self.by_line):
            return None
        return tuple(self.file_end(number) - 1 for number in range(len(self.files)))


def load_records(source: str, split: str = "train") -> Records:
    """Every record of `source`, in file order (files sorted by path)."""
    path = Path(source).expanduser()
    if path.is_dir() and any((path / marker).is_file() for marker in SAVED_MARKERS):
        return _saved(source, path, split)
    files = data_files(source)
    builder = BUILDERS[files[0].suffix]
    if any(BUILDERS[f.suffix] != builder for f in files):
        raise InputError("--data", f"{source} mixes file kinds; give only .txt, only .jsonl, only .csv or only "
                                   ".parquet files")
    import datasets

    parts, file_starts, by_line, rows = [], [], [], 0
    for file in files:
        lines = builder == "text" and file.stat().st_size > LINE_RECORDS_ABOVE_BYTES
        part = _load_file(datasets, builder, file, lines)
        parts.append(part)
        file_starts.append(rows)
        by_line.append(lines)
        rows += len(part)
    dataset = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    return Records(source, builder, dataset, tuple(str(f) for f in files), tuple(file_starts), tuple(by_line))


def data_files(source: str) -> list[Path]:
    """The data files `source` names: itself, the supported files under a directory, or a glob's matches."""
    if any(char in source for char in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(Path(source).expanduser()), recursive=True)
                       if Path(p).is_file() and Path(p).suffix in BUILDERS)
        if not files:
            raise InputError("--data", f"{source} matches no .txt, .jsonl, .csv or .parquet file; allowed: {ALLOWED}")
        return files
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
            raise InputError("--data", f"{source} holds no .txt, .jsonl, .csv or .parquet files; allowed: {ALLOWED}")
        return files
    raise missing_source(source)


def missing_source(source: str) -> InputError:
    """The error for a --data path that names nothing."""
    return InputError("--data", f"no such file or directory: {source}; allowed: {ALLOWED}")


def _load_file(datasets, builder: str, file: Path, lines: bool = False):
    options = {}
    if builder == "text":  # line breaks kept: the lines joined give back the file's text
        options = {"sample_by": "line", "keep_linebreaks": True} if lines else {"sample_by": "document"}
    try:
        with quiet_progress(datasets), _quiet_json_reader():
            return datasets.load_dataset(builder, data_files=[str(file)], split="train",
                                         download_config=datasets.DownloadConfig(local_files_only=True), **options)
    except Exception as err:  # noqa: BLE001 - datasets and pyarrow raise many kinds
        bad_line = first_non_utf8_line(file)
        if bad_line is not None:
            raise InputError("--data", f"{file} {'line' if lines else 'row'} {bad_line} is not UTF-8 text") from None
        if builder == "json":
            bad_json = first_bad_json_line(file)
            if bad_json is not None:
                raise InputError("--data", f"{file} line {bad_json[0]} is not one JSON object ({bad_json[1]}); "
                                           ".jsonl holds one JSON object per line") from None
        raise InputError("--data", f"cannot read {file} as {builder} ({first_line(err)}); "
                                   ".jsonl holds one JSON object per line") from None


def _saved(source: str, path: Path, split: str) -> Records:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001
        raise InputError("--data", f"cannot load the save_to_disk directory {source} ({first_line(err)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise InputError("--data-split", f"{source} has no split {split!r}; its splits: {', '.join(loaded)}")
        loaded = loaded[split]
    return Records(source, "saved", loaded, (source,), (0,))


def first_non_utf8_line(file: Path) -> int | None:
    """The 1-based line of `file` that is not UTF-8, or None (binary formats: None)."""
    if file.suffix == ".parquet":
        return None
    with open(file, "rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return None


def first_bad_json_line(file: Path) -> tuple[int, str] | None:
    """(1-based line number, why) of the first line of a JSON-lines file that is not one
    JSON object (blank lines are allowed), or None: also for a .json file that parses as one
    whole document (then something else was wrong with it)."""
    text = file.read_text(encoding="utf-8")
    if file.suffix == ".json":
        try:
            json.loads(text)
            return None
        except json.JSONDecodeError:
            pass  # JSON lines, perhaps
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            return number, f"{err.msg} at column {err.colno}"
        if not isinstance(value, dict):
            return number, f"a {type(value).__name__}, not an object"
    return None


class _DropJsonReaderError(logging.Filter):
    """datasets logs pyarrow's parse error (rows counted from 0) before raising; the one
    line trainwise prints names the file and line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to load JSON from file")


@contextlib.contextmanager
def _quiet_json_reader() -> Iterator[None]:
    logger, drop = logging.getLogger("datasets.packaged_modules.json.json"), _DropJsonReaderError()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


@contextlib.contextmanager
def quiet_progress(datasets) -> Iterator[None]:
    """Hide datasets' progress bars while it reads (training prints its own progress)."""
    were_enabled = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if were_enabled:
            datasets.enable_progress_bars()
