"""Preemption: SIGTERM, SIGINT and SIGUSR1 end a training run at a step boundary.

A scheduler that preempts a job (SLURM, Kubernetes, a spot instance) sends SIGTERM or a
chosen signal and waits a grace period; Ctrl-C sends SIGINT. While `StopSignals` is
active the first such signal only sets a flag: the run finishes its current optimizer
step, saves a checkpoint, writes its metrics summary and raises `Preempted`, which the
command turns into one line and exit code 128 + the signal's number (what a shell
reports for a process the signal ended: 143, 130, 138 on Linux). A second signal of the
same kind in a one-process run stops at once, as that signal's default action does.

Under torchrun every rank installs the handlers, and at each step boundary the ranks
all-reduce the signal they saw (the largest number wins), so all stop after the same
step and save one consistent distributed checkpoint; ranks may each be sent the signal
(torchrun relays it), so a second one does not stop a rank early there. The launching
process (`--nproc N`) runs torchrun in a session of its own and passes each stop signal on
to it once (a terminal's Ctrl-C would otherwise reach torchrun twice, and its second
relay would cut the workers' save short); torchrun gives the workers 30 s to save before
it kills them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# torchrun relays these to its workers (its default list lacks SIGUSR1).
TORCHRUN_RELAYS = "SIGTERM,SIGINT,SIGUSR1,SIGHUP,SIGQUIT"


class Preempted(Exception):
    """The run stopped on a signal after `step` of `total` steps; `checkpoint` is where it
    was saved (None: no --out, nothing saved). `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int, step: int, total: int, checkpoint: Path | None):
        self.signum, self.step, self.total, self.checkpoint = signum, step, total, checkpoint
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        where = (f"checkpoint saved in {checkpoint}; continue with --resume" if checkpoint is not None
                 else "nothing could be saved (no --out): rerun with --out DIR to keep progress")
        super().__init__(f"stopped by {name} after step {step} of {total}; {where}")


class StopSignals:
    """Context manager: while active, STOP_SIGNALS set a stop request instead of ending the
    process. `requested()` says, at a step boundary, which signal asked to stop (the same
    answer on every rank of `group`'s job), or None."""

    def __init__(self, distributed: bool = False, device=None):
        self.received: int | None = None
        self._distributed, self._device = distributed, device
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        # Python runs signal handlers in the main thread only (and can install them only there).
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def requested(self) -> int | None:
        """The stop signal, agreed by every rank (one small all-reduce per call when
        distributed), or None to go on."""
        if not self._distributed:
            return self.received
        import torch
        import torch.distributed as dist

        flag = torch.tensor([self.received or 0], dtype=torch.int64, device=self._device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) or None

    def _on_signal(self, signum: int, frame) -> None:
        if self.received == signum and not self._distributed:
            # A second one of the same kind: stop now, as the signal's default action does.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.received is None:
            self.received = signum


def start_relaying_child(command: list[str], env: dict, **popen_args) -> subprocess.Popen:
    """Start `command` (torchrun) in its own session, told to pass every stop signal on to
    its workers: a terminal's Ctrl-C then reaches it once, through `relaying_stop_signals`,
    not twice (once from the terminal's process group, once from us)."""
    return subprocess.Popen(command, env={**env, "TORCHELASTIC_SIGNALS_TO_HANDLE": TORCHRUN_RELAYS},
                            start_new_session=True, **popen_args)


@contextlib.contextmanager
def relaying_stop_signals(child: subprocess.Popen) -> Iterator[list[int]]:
    """While active, each stop signal this process gets is sent on to `child`; yields the
    list of the signals relayed so far (see `exit_code_after`)."""
    relayed: list[int] = []

    def relay(signum, frame):
        relayed.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, relay) for signum in STOP_SIGNALS}
    try:
        yield relayed
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def exit_code_after(code: int, relayed: list[int]) -> int:
    """The job's exit code: 128 + the first signal relayed when the job ended on one."""
    return 128 + relayed[0] if relayed and code != 0 else code
