"""Local data files (or a `save_to_disk` directory) read through `datasets` as records,
each remembered with the file and row it came from, so bad data is named where it is.

`--data` may be a file (.txt, .jsonl/.json, .csv, .parquet), a directory of one kind of
them, a glob (`data/*.jsonl`), or a directory written by `Dataset.save_to_disk` /
`DatasetDict.save_to_disk` (then `--data-split` picks the split; default train). Only local
files are read: `datasets` never reaches the network; its Arrow files are memory-mapped."""

from __future__ import annotations

import contextlib
import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from trainwise.common.errors import InputError, first_line

BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
ALLOWED = ("builtin, synthetic, a .txt, .jsonl, .csv or .parquet file, a directory or glob of them, "
           "or a save_to_disk directory")
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


@dataclass(frozen=True)
class Records:
    """The rows of `source` (a datasets.Dataset) and, per row, where it came from."""

    source: str
    kind: str  # the datasets builder (text, json, csv, parquet), or "saved"
    dataset: object
    files: tuple[str, ...]
    file_of_row: tuple[int, ...]  # index into files, per row
    row_in_file: tuple[int, ...]  # 1-based row (record) number within that file, per row

    def where(self, index: int) -> str:
        return f"{self.files[self.file_of_row[index]]} row {self.row_in_file[index]}"


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

    parts, file_of_row, row_in_file = [], [], []
    for number, file in enumerate(files):
        part = _load_file(datasets, builder, file)
        parts.append(part)
        file_of_row += [number] * len(part)
        row_in_file += range(1, len(part) + 1)
    dataset = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    return Records(source, builder, dataset, tuple(str(f) for f in files), tuple(file_of_row), tuple(row_in_file))


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
    raise InputError("--data", f"no such file or directory: {source}; allowed: {ALLOWED}")


def _load_file(datasets, builder: str, file: Path):
    options = {"sample_by": "document"} if builder == "text" else {}
    try:
        with quiet_progress(datasets):
            return datasets.load_dataset(builder, data_files=[str(file)], split="train",
                                         download_config=datasets.DownloadConfig(local_files_only=True), **options)
    except Exception as err:  # noqa: BLE001 - datasets and pyarrow raise many kinds
        bad_line = first_non_utf8_line(file)
        if bad_line is not None:
            raise InputError("--data", f"{file} row {bad_line} is not UTF-8 text") from None
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
    return Records(source, "saved", loaded, (source,), (0,) * len(loaded), tuple(range(1, len(loaded) + 1)))


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
