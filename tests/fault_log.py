"""The record behind docs/reliability.md: every injected fault and bad input a test tries.

A reliability test ends (after its assertions) with

    fault_log(kind="fault", case="kill -9 of rank 1 during step 3", exit_code=0,
              message="...", lost=0)

`kind` is "fault" (something went wrong around a correct request: a signal, a dead rank,
a damaged file, a full disk) or "bad input" (the request itself is wrong). `lost` counts
runs or files that existed before the fault and are gone or changed after it; the tests
assert it is 0. `benchmarks/reliability_report.py` runs the tests that record (marker
`fault`) with TRAINWISE_FAULT_LOG set and renders the records, so the document lists
exactly what the suite tried.

`tree_digest` and `lost_files` count what a fault destroyed: digest a directory before,
then compare after.
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

    def add(self, test: str, *, kind: str, case: str, exit_code: int | None, message: str, lost: int) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.records.append({"test": test, "kind": kind, "case": case, "exit_code": exit_code,
                             "message": " ".join(message.split()), "lost": lost})

    def write(self) -> None:
        target = os.environ.get(LOG_VARIABLE)
        if target and self.records:
            Path(target).write_text(json.dumps(self.records, indent=1))


def tree_digest(root: str | Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `root` (a file: itself); {} if absent."""
    root = Path(root)
    if root.is_file():
        return {".": hashlib.sha256(root.read_bytes()).hexdigest()}
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def lost_files(before: dict[str, str], after: dict[str, str]) -> int:
    """Files of `before` that are missing or changed in `after`."""
    return sum(1 for name, digest in before.items() if after.get(name) != digest)
