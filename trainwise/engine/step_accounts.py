"""What the training loop accounts for at each read point: the state a checkpoint
records (steps, data position, skipped steps, elapsed time, last loss), each step's
measured time, and the checks on the values read (a non-finite loss, a run of fp16
overflows). Values are read in batches (engine/pending_steps.py), so `--on-nan stop`
notices a non-finite loss at the first read point after it: at most `--log-every` - 1
steps later, and always before a checkpoint is saved or an evaluation runs."""

from __future__ import annotations

import math

from trainwise.engine.checkpoint import TrainingState
from trainwise.engine.faults import MAX_CONSECUTIVE_SCALER_SKIPS, NonFiniteLoss, diagnose_non_finite
from trainwise.engine.metrics import StepTimer
from trainwise.engine.run_config import RunConfig
from trainwise.engine.step_values import StepValues
from trainwise.plan.plan import Plan


class StepAccounts:
    """The run's bookkeeping between read points: the training state a checkpoint records,
    each step's measured times, and the fp16 overflow run."""

    def __init__(self, state: TrainingState, timer: StepTimer, first_timed: int, untimed: set[int]):
        self.state, self.timer, self.first_timed, self.untimed = state, timer, first_timed, untimed
        self.times: dict[int, tuple[float, float]] = {}
        self.compiled: set[int] = set()  # steps during which torch.compile compiled: timed apart
        self.elapsed, self.consecutive_skips, self.last = 0.0, 0, None

    def note_compiled(self, step: int, compiled: bool) -> None:
        if compiled:
            self.compiled.add(step)

    def record_times(self, windows: list[tuple[int, float, float]]) -> None:
        """(step, wall s, CPU s) of each step of a closed timing window (a step that compiled
        closes its window, so its time is its own)."""
        for step, wall, cpu in windows:
            self.timer.record(wall, timed=step >= self.first_timed and step not in self.untimed,
                              compiled=step in self.compiled)
            self.times[step] = (wall, cpu)
            self.elapsed += wall

    def timing(self, step: int) -> dict:
        """StepLog's time fields of `step` (seconds, per second, MFU a fraction): None
        until its timing window has closed."""
        if step not in self.times:
            return {**self.timer.rates(None), **dict.fromkeys(("step_time_s", "mfu", "step_cpu_s"))}
        wall, cpu = self.times[step]
        return {"step_time_s": wall, **self.timer.rates(wall), "mfu": self.timer.mfu_for(wall), "step_cpu_s": cpu}

    def read(self, read: list, consumed: int, plan: Plan, run: RunConfig) -> StepValues:
        """Check the steps just read (stop on a non-finite loss), advance the state to the
        last of them; that step's values."""
        for step, values in read:
            self.consecutive_skips = check_finite(values, step, plan, run, self.consecutive_skips)
        step, self.last = read[-1]
        skipped = self.state.skipped_steps + sum(values.skipped for _, values in read)
        self.state = TrainingState(step=step + 1, micro_batches_consumed=consumed, skipped_steps=skipped,
                                   extra={"elapsed_s": self.state.extra.get("elapsed_s", 0.0) + self.elapsed,
                                          "last_loss": self.last.loss})
        self.elapsed = 0.0
        return self.last


def check_finite(outcome: StepValues, step: int, plan: Plan, run: RunConfig, consecutive_skips: int) -> int:
    """Stop on a non-finite loss unless told to skip; count fp16 overflow runs."""
    finite = math.isfinite(outcome.loss)
    if not finite and plan.precision != "fp16" and run.on_nan == "stop":
        raise NonFiniteLoss(step + 1, outcome.loss, diagnose_non_finite(plan))
    consecutive_skips = consecutive_skips + 1 if outcome.skipped else 0
    if consecutive_skips >= MAX_CONSECUTIVE_SCALER_SKIPS and run.on_nan == "stop":
        raise NonFiniteLoss(step + 1, outcome.loss, diagnose_non_finite(plan, persistent_fp16=True))
    return consecutive_skips
