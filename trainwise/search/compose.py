"""Composing a plan's prediction from two traced micro-batch sizes, instead of tracing it.

Assumptions (checked against exact estimates in tests/test_search.py):
- device memory and the per-micro-batch step time are linear in the micro-batch (activations,
  temporaries and the work on them scale with the rows; weights, gradients and optimizer
  state do not), so two traced sizes give the line;
- an optimizer step of `accum` micro-batches costs `accum` times the per-micro-batch
  categories plus once the per-step ones (the optimizer update, and the gradient
  synchronisation that accumulation defers to the last micro-batch);
- accumulation does not change the peak (gradients are held either way)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Breakdown categories paid once per optimizer step, whatever the accumulation.
PER_STEP_CATEGORIES = frozenset({"optimizer", "communication_exposed", "communication_overlapped"})
# Shown for information only: not on the critical path, so not part of step_s.
OFF_PATH_CATEGORIES = frozenset({"communication_overlapped"})


@dataclass(frozen=True)
class Measure:
    """What the evaluator says of one plan. memory_bytes: predicted device total (bytes);
    step_s: predicted seconds per optimizer step, None without a time prediction;
    breakdown: seconds per category; ideal_s: the seconds the step's FLOPs take at the
    device's peak (mfu x step_s), None without a peak."""

    memory_bytes: int
    step_s: float | None
    breakdown: dict[str, float] = field(default_factory=dict)
    ideal_s: float | None = None

    @property
    def mfu(self) -> float | None:
        if self.ideal_s is None or not self.step_s:
            return None
        return self.ideal_s / self.step_s


def composed(low: tuple[int, Measure], high: tuple[int, Measure], micro_batch: int, accum: int) -> Measure:
    """The Measure of (micro_batch, accum) from two traced (size, Measure) points taken at
    accumulation 1. With one point (low == high), memory and time scale by nothing but the
    accumulation."""
    (b0, m0), (b1, m1) = low, high
    memory = _line(b0, m0.memory_bytes, b1, m1.memory_bytes, micro_batch)
    if m0.step_s is None or m1.step_s is None:
        return Measure(memory_bytes=int(math.ceil(memory)), step_s=None)
    breakdown = {}
    for name in set(m0.breakdown) | set(m1.breakdown):
        per = _line(b0, m0.breakdown.get(name, 0.0), b1, m1.breakdown.get(name, 0.0), micro_batch)
        per = max(per, 0.0)
        breakdown[name] = per if name in PER_STEP_CATEGORIES else per * accum
    per_step = _per_step_rest(m0, b0, m1, b1, micro_batch)
    step = sum(v for k, v in breakdown.items() if k not in OFF_PATH_CATEGORIES) + per_step * accum
    ideal = None
    if m0.ideal_s is not None and m1.ideal_s is not None:
        ideal = _line(b0, m0.ideal_s, b1, m1.ideal_s, micro_batch) * accum
    return Measure(memory_bytes=int(math.ceil(memory)), step_s=step, breakdown=breakdown, ideal_s=ideal)


def _per_step_rest(m0: Measure, b0: int, m1: Measure, b1: int, micro_batch: int) -> float:
    """Seconds of step_s not in any on-path category (the time model may leave some out of
    the breakdown); counted per micro-batch."""
    rest0 = m0.step_s - sum(v for k, v in m0.breakdown.items() if k not in OFF_PATH_CATEGORIES)
    rest1 = m1.step_s - sum(v for k, v in m1.breakdown.items() if k not in OFF_PATH_CATEGORIES)
    return max(_line(b0, rest0, b1, rest1, micro_batch), 0.0)


def _line(x0: int, y0: float, x1: int, y1: float, x: int) -> float:
    if x0 == x1:
        return y1
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
