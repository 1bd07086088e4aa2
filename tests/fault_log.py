"""The record behind docs/reliability.md: every injected fault and bad input a test tries.

A reliability test marks what a fault must not destroy, then ends (after its assertions)
with one record per case:

    fault_log.watch(output)              # before the fault: every file there, and its sha256
    fault_log.saved(checkpoint)          # after it: the files a completed save listed
    fault_log(kind="fault", case="kill -9 of rank 1 during step 3", exit_code=0, message="...")

`kind` is "fault" (something went wrong around a correct request: a signal, a dead rank,
a damaged file, a full disk) or "bad input" (the request itself is wrong). `lost` is
measured when the case is recorded: the watched files (those there before the fault, and
those a completed save's manifest lists) that are missing or changed; `watched` is how many
there were. A case that lost a file fails its test, naming the files. `benchmarks/reliability_report.py` runs the tests that record (marker
`fault`) with TRAINWISE_FAULT_LOG set and renders the records, so the document lists
exactly what the suite tried.

`tree_digest` and `lost_files` count what a fault destroyed: digest a directory before,
then compare after; `FaultWatch` does it for the fixture.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

LOG_VARIABLE = "TRAINWISE_FAULT_LOG"
KINDS = ("fault", "bad input")


class FaultLog:
    """Collects the records of one pytest session (see the module docstring)."""

    def __init__(self):
        self.records: list[dict] = []

    def add(self, test: str, *, kind: str, case: str, exit_code: int | None, message: str, lost: int,
            watched: int) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.records.append({"test": test, "kind": kind, "case": case, "exit_code": exit_code,
                             "message": " ".join(message.split()), "lost": lost, "watched": watched})

    def write(self) -> None:
        target = os.environ.get(LOG_VARIABLE)
        if target and self.records:
            Path(target).write_text(json.dumps(self.records, indent=1))


class FaultWatch:
    """The files one test's fault must leave as they were: {path: sha256}, by absolute path."""

    def __init__(self):
        self.expected: dict[str, str] = {}

    def watch(self, root: str | Path) -> None:
        """Every file under `root` now (call before the fault)."""
        root = Path(root).resolve()
        self.expected.update({str(root / name) if name != "." else str(root): digest
                              for name, digest in tree_digest(root).items()})

    def saved(self, checkpoint: str | Path) -> None:
        """Every file a completed save wrote, as its manifest lists them (the manifest is
        written last, so these are the files the save finished)."""
        checkpoint = Path(checkpoint).resolve()
        listed = json.loads((checkpoint / "manifest.json").read_text())["files"]
        self.expected.update({str(checkpoint / name): entry["sha256"] for name, entry in listed.items()})

    def lost(self) -> list[str]:
        """The watched files missing or changed now."""
        return [path for path, digest in sorted(self.expected.items())
                if not Path(path).is_file() or _sha256(Path(path)) != digest]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(root: str | Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `root` (a file: itself); {} if absent."""
    root = Path(root)
    if root.is_file():
        return {".": _sha256(root)}
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): _sha256(p)
            for p in sorted(root.rglob("*")) if p.is_file()}


def lost_files(before: dict[str, str], after: dict[str, str]) -> int:
    """Files of `before` that are missing or changed in `after`."""
    return sum(1 for name, digest in before.items() if after.get(name) != digest)
