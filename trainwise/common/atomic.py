"""Atomic file and directory writes: a reader sees the old file or the new one, never half.

Checkpoints, exports, metrics summaries and result files all go through here: write to a
temporary name in the same directory (same filesystem, so the rename is atomic), flush
to disk, then rename over the destination.

What may be replaced. A directory write replaces only what trainwise itself wrote, so a
mistyped destination never costs the user a file. `atomic_directory` puts an empty marker
file, `.trainwise-output`, into every directory it creates (checkpoints, final/, exports),
and replaces an existing destination only when it is

    - a directory holding that marker (trainwise wrote it before: a previous export, final/),
    - a directory holding `trainwise.json` (a checkpoint written before the marker existed),
    - or an empty directory (nothing to lose).

Anything else at the destination (a file, a symlink, a directory of the user's own) is
refused with InputError naming the path, before any work, and is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from trainwise.common.errors import InputError

MARKER = ".trainwise-output"
_LEGACY_CHECKPOINT_FILE = "trainwise.json"


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def written_by_trainwise(path: str | Path) -> bool:
    """Whether the directory `path` is one trainwise may replace (see the module docstring)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return False
    return (path / MARKER).is_file() or (path / _LEGACY_CHECKPOINT_FILE).is_file() or not any(path.iterdir())


def check_replaceable(path: str | Path, flag: str = "--out") -> None:
    """Raise InputError(flag, ...) unless `path` is absent or a directory trainwise may replace."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise InputError(flag, f"{path} exists and is not a directory trainwise wrote (a file or a link); "
                               "it is left as it is: move it or choose another path")
    if not written_by_trainwise(path):
        raise InputError(flag, f"{path} is a directory trainwise did not write (no {MARKER} in it); it is left "
                               "as it is: choose another path, or empty it")


@contextlib.contextmanager
def atomic_directory(path: str | Path, flag: str = "--out") -> Iterator[Path]:
    """Yield a fresh temporary directory beside `path`; on success it replaces `path`.

    If the block raises, the temporary directory is removed and `path` is untouched. An
    existing `path` must be one trainwise may replace (else InputError(flag, ...), checked
    before and again after the block); it is moved aside first and deleted only after the
    new one is in place."""
    path = Path(path)
    check_replaceable(path, flag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        (tmp / MARKER).write_bytes(b"")
        yield tmp
        _fsync_tree(tmp)
        check_replaceable(path, flag)  # the block may have run for hours
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_tree(root: Path) -> None:
    for file in root.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
