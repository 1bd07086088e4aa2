"""The checkpoint saves of one training run: one-device and distributed, synchronous or, for
a distributed run under `--checkpoint-async`, asynchronous (engine/parallel/async_checkpoint.py).

A write that fails (disk full, no permission, read back wrong) ends the run with
WriteFailed naming the checkpoint left intact, whether it failed when the save started or
when a save in flight was completed."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from trainwise.common.errors import InputError, WriteFailed, first_line
from trainwise.engine.checkpoint import CHECKPOINTS, TrainingState, latest_checkpoint, save_checkpoint
from trainwise.engine.checkpoint_manifest import DamagedCheckpoint
from trainwise.engine.run_config import RunConfig


def check_async_request(run: RunConfig, distributed: bool) -> None:
    """Refuse --checkpoint-async where no distributed checkpoint is saved."""
    if not run.checkpoint_async:
        return
    if not distributed:
        raise InputError("--checkpoint-async", "needs --nproc 2 or more (asynchronous saves write distributed "
                                               "checkpoints; a one-process run saves synchronously)")
    if not run.output:
        raise InputError("--checkpoint-async", "needs --output DIR (where the checkpoints are saved)")


class CheckpointSaves:
    """Every save of one run: `save` for a periodic one (asynchronous under
    --checkpoint-async), `save_now` for the last one and a stop's (synchronous), `wait` to
    complete a save still in flight."""

    def __init__(self, run: RunConfig, setup, plan):
        self.run, self.setup, self.plan = run, setup, plan
        self._async = None
        if setup.has_mesh and run.checkpoint_async:
            from trainwise.engine.parallel.async_checkpoint import AsyncSaves

            self._async = AsyncSaves(run.output, setup=setup, plan=plan, run=run)

    def save(self, state: TrainingState) -> Path:
        """Save step `state.step`; under --checkpoint-async the path it will have once complete."""
        if self._async is None:
            return self.save_now(state)
        self.wait()
        with self._writing(state.step):
            return self._async.start(state)

    def save_now(self, state: TrainingState) -> Path:
        """Save step `state.step` and return its complete checkpoint (a save in flight first)."""
        self.wait()
        with self._writing(state.step):
            if self._async is not None:
                return self._async.save_now(state)
            if self.setup.has_mesh:
                from trainwise.engine.parallel.distributed_checkpoint import save_distributed_checkpoint

                return save_distributed_checkpoint(self.run.output, state, setup=self.setup, plan=self.plan,
                                                   run=self.run)
            return save_checkpoint(self.run.output, state, model=self.setup.model, optimizer=self.setup.optimizer,
                                   scheduler=self.setup.scheduler, scaler=self.setup.scaler, plan=self.plan,
                                   run=self.run)

    def wait(self) -> Path | None:
        """Complete the save in flight, if any; its checkpoint's path."""
        if self._async is None or self._async.in_flight is None:
            return None
        with self._writing(self._async.in_flight):
            return self._async.wait()

    @contextmanager
    def _writing(self, step_or_path):
        step = step_or_path if isinstance(step_or_path, int) else int(Path(step_or_path).name.split("-")[1])
        try:
            yield
        except (OSError, DamagedCheckpoint, RuntimeError) as err:
            if isinstance(err, RuntimeError) and "PytorchStreamWriter" not in str(err):
                raise  # torch's file writer reports a failed write as a RuntimeError; other ones are not ours
            raise WriteFailed(_save_failure(self.run.output, step, err)) from err


def _save_failure(output, step: int, err: Exception) -> str:
    reason = getattr(err, "strerror", None) or first_line(err)
    previous = latest_checkpoint(output)
    kept = (f"the previous checkpoint {previous.name} is intact" if previous is not None
            else "no earlier checkpoint was there to keep")
    return f"could not save checkpoint step-{step:08d} in {Path(output) / CHECKPOINTS}: {reason}; {kept}"
