"""Throughput bookkeeping and the JSON-lines metrics file (DESIGN.md's contract).

The file is appended one whole line per write and flushed, so a run killed at any
moment leaves only whole lines; a resumed run first drops what came after its
checkpoint. Non-finite numbers are written as null (the file stays strict JSON)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainwise.engine.flops import mfu
from trainwise.plan.atomic import atomic_write_text


class StepTimer:
    """Step durations (seconds) and the rates they imply. Warm-up steps (compilation,
    allocator growth) and the CPU memory-probe step are recorded but not timed."""

    def __init__(self, *, samples_per_step: int, tokens_per_step: int, flops_per_step: int | None,
                 peak_flops: float | None):
        self.samples_per_step, self.tokens_per_step = samples_per_step, tokens_per_step
        self.flops_per_step, self.peak_flops = flops_per_step, peak_flops
        self.timed: list[float] = []
        self.untimed: list[float] = []

    def record(self, seconds: float, timed: bool) -> None:
        (self.timed if timed else self.untimed).append(seconds)

    def mfu_for(self, seconds: float) -> float | None:
        if self.flops_per_step is None or seconds <= 0:
            return None
        return mfu(self.flops_per_step / seconds, self.peak_flops)

    def summary(self, total_time_s: float) -> dict:
        """Rates over the timed steps (all steps when none was timed, flagged)."""
        durations = self.timed or self.untimed
        busy = sum(durations)
        steps = len(durations)
        per_step = busy / steps if steps else None
        return {"time_s": total_time_s,
                "samples_per_s": self.samples_per_step / per_step if per_step else None,
                "tokens_per_s": self.tokens_per_step / per_step if per_step else None,
                "mfu": self.mfu_for(per_step) if per_step else None,
                "timed_steps": len(self.timed),
                "rates_include_warmup": not self.timed}


class MetricsLog:
    """Writes metric lines to `path` (nothing when None)."""

    def __init__(self, path: str | None, resume_from_step: int | None = None):
        self.path = Path(path) if path else None
        if self.path is None:
            return
        kept = _lines_up_to(self.path, resume_from_step) if resume_from_step is not None else []
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def step(self, line: dict) -> None:
        self._append(line)

    def summary(self, summary: dict) -> None:
        self._append({"summary": summary})

    def _append(self, record: dict) -> None:
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(_finite(record), allow_nan=False) + "\n")
            handle.flush()


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
