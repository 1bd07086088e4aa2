"""The JSON-lines metrics file (`--metrics FILE`), in the format docs/train.md documents.

One line per logged step, its keys first ({"step", "loss", "lr", "tokens_per_s",
"samples_per_s", "mfu", "peak_allocated", "skipped"}; one the writer did not give is
null), then any extras; a last line {"summary": {...}} likewise. Units: seconds, bytes,
per-second rates, MFU as a fraction.

Each line is appended with one write and flushed, so a run killed at any moment leaves
only whole lines, at most followed by one torn line; a resumed run first rewrites the
file (atomically) without the torn line and without what came after its checkpoint.
Non-finite numbers are written as null, so the file stays strict JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainwise.engine.throughput import StepTimer
from trainwise.common.atomic import atomic_write_text

__all__ = ["MetricsLog", "STEP_KEYS", "SUMMARY_KEYS", "StepTimer"]

STEP_KEYS = ("step", "loss", "lr", "tokens_per_s", "samples_per_s", "mfu", "peak_allocated", "skipped")
SUMMARY_KEYS = ("time_s", "samples_per_s", "tokens_per_s", "mfu", "peak_allocated", "peak_reserved",
                "device_total", "final_loss")


class MetricsLog:
    """Writes metric lines to `path` (nothing at all when `path` is None).

    A fresh run (`resume_from_step` None) starts the file empty; a run resumed from the
    checkpoint after step k keeps the whole step lines with step <= k."""

    def __init__(self, path: str | Path | None, resume_from_step: int | None = None, mirrors: list | None = None):
        self.path = Path(path) if path else None
        # Dashboards and the chart (engine/reports.py): each gets every line this file gets.
        self.mirrors = list(mirrors or [])
        if self.path is None:
            return
        kept = _lines_up_to(self.path, resume_from_step) if resume_from_step is not None else []
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def step(self, line: dict) -> None:
        """Append one step line (`line` needs at least "step")."""
        line = _finite(_in_order(line, STEP_KEYS))
        self._append(line)
        for mirror in self.mirrors:
            mirror.step(line)

    def summary(self, summary: dict) -> None:
        """Append the run's summary line (the last line of the file), and close the mirrors.
        With mirrors, `summary` gains "reports": where each one wrote (for the run's output)."""
        if self.mirrors:
            summary["reports"] = [mirror.describe() for mirror in self.mirrors]
        summary = _in_order(summary, SUMMARY_KEYS)
        self._append({"summary": summary})
        self.close(summary)

    def close(self, summary: dict | None = None) -> None:
        """Hand the mirrors the summary (when the run got that far) and close them; once."""
        mirrors, self.mirrors = self.mirrors, []
        for mirror in mirrors:
            if summary is not None:
                mirror.summary(_finite(summary))
            mirror.close()

    def _append(self, record: dict) -> None:
        if self.path is None:
            return
        text = json.dumps(_finite(record), allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()


def _in_order(record: dict, keys: tuple[str, ...]) -> dict:
    """`keys` first, in their order (null where missing), then the extras."""
    return {**{key: record.get(key) for key in keys}, **{k: v for k, v in record.items() if k not in keys}}


def _lines_up_to(path: Path, last_step: int) -> list[str]:
    """Whole step lines with step <= last_step; torn lines and summaries are dropped."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn last line of a killed run
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= last_step:
            kept.append(line)
    return kept


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
