"""The steps the loop has run but not yet read or timed.

The loop waits for the device only at a read point (a logged step, an evaluation, a
checkpoint, the end or a stop) and where a timing window must close (the end of the
warm-up). A step's wall and CPU seconds are measured over its window: the window's time
divided by its steps, after a device synchronisation, so queued GPU work is included. On
a CPU nothing is queued, every step is its own window, and step times are exact."""

from __future__ import annotations

import time

import torch

from trainwise.engine.runtime import synchronize
from trainwise.engine.step_values import StepValues, read_outcomes
from trainwise.engine.train_step import StepOutcome


def clocks() -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds): a time is the difference of two."""
    return time.perf_counter(), time.process_time()


class PendingSteps:
    """Outcomes not yet read and steps not yet timed, on `device`."""

    def __init__(self, device: torch.device):
        self.device = device
        self._outcomes: list[tuple[int, StepOutcome]] = []
        self._untimed: list[int] = []
        self._since = clocks()

    def add(self, step: int, outcome: StepOutcome) -> None:
        self._outcomes.append((step, outcome))
        self._untimed.append(step)

    def close_window(self) -> list[tuple[int, float, float]]:
        """Wait for the device; (step, wall seconds, CPU seconds) of each step since the
        window opened, each its share of the window."""
        synchronize(self.device)
        now = clocks()
        wall, cpu = (after - before for after, before in zip(now, self._since))
        steps, self._untimed = self._untimed, []
        return [(step, wall / len(steps), cpu / len(steps)) for step in steps] if steps else []

    def restart_clock(self) -> None:
        """Open the next window now: what ran since the last close (logging, evaluation,
        saving) is not a step's time."""
        if not self._untimed:
            self._since = clocks()

    def read(self) -> list[tuple[int, StepValues]]:
        """Every pending step's values, read with one copy per device, in step order."""
        steps = [step for step, _ in self._outcomes]
        values = read_outcomes([outcome for _, outcome in self._outcomes])
        self._outcomes = []
        return list(zip(steps, values))
