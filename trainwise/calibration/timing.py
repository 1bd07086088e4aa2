"""Timing a small piece of work honestly, and fitting a latency-bandwidth Rate to it.

`time_call` warms the work up, repeats it enough times per sample that the timer's own
cost does not matter, and reports the median over several samples with their spread
((max - min) / median). `fit_rate` fits `seconds = fixed_s + size / per_s` to the
(size, median seconds) points of one kind of work by least squares on the relative
error, so the small sizes (which set the fixed term) weigh as much as the large ones
(which set the throughput)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from trainwise.hardware.profile import Rate


@dataclass(frozen=True)
class Settings:
    """How hard to measure: `repeats` samples per size, each at least `sample_s` seconds
    of work; sizes whose single call exceeds `max_call_s` are left out (slow dtypes)."""

    repeats: int
    sample_s: float
    max_call_s: float
    quick: bool


FULL = Settings(repeats=9, sample_s=0.005, max_call_s=0.25, quick=False)
QUICK = Settings(repeats=3, sample_s=0.001, max_call_s=0.1, quick=True)


@dataclass(frozen=True)
class Timing:
    seconds: float  # median seconds of one call
    spread: float  # (max - min) / median over the samples, a fraction


@dataclass
class Fit:
    """A fitted Rate, the points it came from and the largest spread among them."""

    rate: Rate
    points: list[tuple[float, float]] = field(default_factory=list)  # (size, seconds)
    spread: float = 0.0


class Synchronizer:
    """Waits for queued work on a device (a no-op on the CPU) and names the clock to time
    it with: wall time, on every device and at every thread count, because a training
    step's time (`step_time_s` of `trainwise train`) is wall time and a profile predicts
    it. (This process's CPU time, which a busy machine does not stretch, was used at one
    thread; a profile measured so predicted a step with a core to itself, not the step a
    user times.)"""

    def __init__(self, wait: Callable[[], None], clock: Callable[[], float]):
        self.wait, self.clock = wait, clock

    def __call__(self) -> None:
        self.wait()


def synchronizer(device) -> Synchronizer:
    """The Synchronizer of `device`."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return Synchronizer(lambda: torch.cuda.synchronize(device), time.perf_counter)
    return Synchronizer(lambda: None, time.perf_counter)


def clock_of(sync: Callable[[], None]) -> Callable[[], float]:
    return getattr(sync, "clock", time.perf_counter)


def time_call(work: Callable[[], object], sync: Callable[[], None], settings: Settings) -> Timing:
    """Median seconds of one call of `work` over `settings.repeats` samples (after a warm-up)."""
    return time_side_by_side([work], sync, settings)[0]


def time_side_by_side(works: list[Callable[[], object]], sync: Callable[[], None],
                      settings: Settings) -> list[Timing]:
    """`time_call` of each of `works`, their samples taken in turn (a sample of the first,
    one of the second, ..., repeated), so that a change in the machine's speed over the
    seconds they take meets all of them alike: their ratio holds where their separate
    medians, taken one after the other, would drift apart."""
    for work in works:
        work()  # warm-up: first-call costs (allocation, kernel selection) are not the op's
    calls = [max(1, min(10_000, math.ceil(settings.sample_s / max(first_call_seconds(work, sync), 1e-7))))
             for work in works]
    samples, clock = [[] for _ in works], clock_of(sync)
    for _ in range(settings.repeats):
        for work, count, taken in zip(works, calls, samples):
            sync()
            started = clock()
            for _ in range(count):
                work()
            sync()
            taken.append((clock() - started) / count)
    timings = []
    for taken in samples:
        median = statistics.median(taken)
        timings.append(Timing(median, (max(taken) - min(taken)) / median if median > 0 else 0.0))
    return timings


def first_call_seconds(work: Callable[[], object], sync: Callable[[], None]) -> float:
    """One call's seconds, the warm-up included: decides whether a size is worth timing."""
    clock = clock_of(sync)
    sync()
    started = clock()
    work()
    sync()
    return clock() - started


def fit_rate(points: list[tuple[float, float]]) -> Rate:
    """The Rate through (size, seconds) points: least squares on relative error, the fixed
    term held at >= 0; with one point (or a non-positive slope) the best throughput seen."""
    usable = [(x, t) for x, t in points if x > 0 and t > 0]
    if not usable:
        raise ValueError("no timed point to fit a rate to")
    # Minimise sum(((a + b x) - t) / t)^2: weights 1/t^2 on the normal equations.
    s00 = sum(1 / t**2 for _, t in usable)
    s01 = sum(x / t**2 for x, t in usable)
    s11 = sum(x * x / t**2 for x, t in usable)
    r0 = sum(1 / t for _, t in usable)
    r1 = sum(x / t for x, t in usable)
    det = s00 * s11 - s01 * s01
    fixed, slope = ((r0 * s11 - r1 * s01) / det, (s00 * r1 - s01 * r0) / det) if det > 0 else (0.0, 0.0)
    if fixed < 0 or det <= 0:
        fixed, slope = 0.0, r1 / s11
    if slope <= 0 or not math.isfinite(slope):
        return Rate(max(x / t for x, t in usable), 0.0)
    return Rate(1.0 / slope, fixed)


def fit(points: list[tuple[float, float, float]]) -> Fit:
    """A Fit from (size, seconds, spread) triples."""
    return Fit(fit_rate([(x, t) for x, t, _ in points]), [(x, t) for x, t, _ in points],
               max((s for _, _, s in points), default=0.0))


def measure_sizes(cases, sync, settings: Settings) -> list[tuple[float, float, float]]:
    """(size, median seconds, spread) for each (size, make_work) in `cases`, smallest
    first (`make_work()` allocates the tensors and returns the call to time, so only one
    size's tensors are alive at a time); stops before a size whose first call takes longer
    than `settings.max_call_s`, but always times at least two sizes so a rate can be fitted."""
    timed = []
    for size, make_work in sorted(cases, key=lambda case: case[0]):
        work = make_work()
        if len(timed) >= 2 and first_call_seconds(work, sync) > settings.max_call_s:
            break
        timing = time_call(work, sync, settings)
        timed.append((float(size), timing.seconds, timing.spread))
    return timed
