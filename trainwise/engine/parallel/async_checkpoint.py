"""Asynchronous distributed checkpoint saves (`--checkpoint-async`, runs of several processes).

A save copies this rank's shards of the model and optimizer into host memory (the step
waits for that copy) and hands the copy to torch.distributed.checkpoint.async_save, which
writes it from a background thread while training goes on. The checkpoint is completed
later, by the next save or at the end of the run: every rank waits for its writer, then
rank 0 writes the manifest last and renames the directory into place
(distributed_checkpoint.finish_distributed_save), as a synchronous save does. So a job
killed while a save is in flight leaves that save's hidden temporary directory and the
previous checkpoint as the latest one.

At most one save is in flight: a save first completes the previous one. The run's last
save and a save for a stop signal are synchronous (the final export and the next launch
read them), and a run completes a save still in flight before it ends.

The background writer coordinates the ranks over a gloo process group of its own, created
at the first asynchronous save: the training collectives keep the default group, and two
threads must never issue collectives on one group (their order would differ between ranks).
The writer is a thread, not a process: DCP's process-based writer starts a process per rank
with a process group of its own, a cost a run pays once; the thread shares the interpreter's
lock with training's Python code, which is small next to the tensor work it overlaps.

Cost: host memory for one copy of this rank's shards while a save is in flight (a
synchronous save writes from the tensors themselves), and the step that starts the save
waits for the copy to host memory."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from trainwise.engine.checkpoint import TrainingState
from trainwise.engine.parallel.distributed_checkpoint import (DCP_FOLDER, SaveInProgress, abandon_distributed_save,
                                                             begin_distributed_save, finish_distributed_save)


class AsyncSaves:
    """The distributed checkpoint saves of one run, at most one of them in flight."""

    def __init__(self, output, *, setup, plan, run, keep: int = 2):
        self.output, self.setup, self.plan, self.run, self.keep = output, setup, plan, run, keep
        self._group = None  # the writer's process group, made at the first save
        self._in_flight: tuple[SaveInProgress, Future] | None = None

    def start(self, state: TrainingState) -> Path:
        """Complete the save in flight, if any, then start saving step `state.step` and return
        the path its checkpoint will have (complete only after `wait`)."""
        self.wait()
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        save, shards = begin_distributed_save(self.output, state, setup=self.setup, plan=self.plan, run=self.run,
                                              keep=self.keep)
        try:
            written = dcp.async_save(shards, checkpoint_id=str(save.tmp / DCP_FOLDER), process_group=self._group)
        except BaseException as err:
            abandon_distributed_save(save, err)
            raise
        self._in_flight = (save, written)
        return save.path

    def save_now(self, state: TrainingState) -> Path:
        """A synchronous save (the run's last, a stop's), after the one in flight."""
        from trainwise.engine.parallel.distributed_checkpoint import save_distributed_checkpoint

        self.wait()
        return save_distributed_checkpoint(self.output, state, setup=self.setup, plan=self.plan, run=self.run,
                                           keep=self.keep)

    def wait(self) -> Path | None:
        """Complete the save in flight (every rank): its checkpoint's path, or None if none was."""
        if self._in_flight is None:
            return None
        save, written = self._in_flight
        self._in_flight = None
        try:
            written.result()  # this rank's shards are written (or the writer's error is raised here)
        except BaseException as err:
            abandon_distributed_save(save, err)
            raise
        return finish_distributed_save(save)

    @property
    def in_flight(self) -> Path | None:
        """The path of the save in flight, None when there is none."""
        return self._in_flight[0].path if self._in_flight else None
