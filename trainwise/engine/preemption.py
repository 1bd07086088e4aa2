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
it kills them. A launcher or torchrun that dies without passing a signal on (SIGKILL)
still stops the job: each of torchrun and the workers asked the kernel for SIGTERM when
its parent dies (trainwise/common/parent_death.py).

Across nodes (`--nnodes N`) a signal may reach one node's launcher only. The all-reduce
spans every rank of every node, so all still stop after the same step; a rank that learns
of the stop from its peers tells its own launcher (a notice file the launcher named, then
NOTICE_SIGNAL), which passes that stop signal on to its torchrun as if it had been sent it:
every node's agent then waits for its workers to save instead of restarting them, and every
launcher ends with 128 + the signal. A launcher that already relayed a signal ignores notices,
and one that relayed a notice does not relay its own copy of that signal arriving after it
(a scheduler that signals every node): torchrun gets each stop once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

from trainwise.common.errors import Preempted
from trainwise.common.parent_death import child_stopping_with

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# torchrun relays these to its workers (its default list lacks SIGUSR1).
TORCHRUN_RELAYS = "SIGTERM,SIGINT,SIGUSR1,SIGHUP,SIGQUIT"
# Set by a multi-node launcher for its workers: where a stop agreed with other nodes is
# written, and the launcher's process id, sent NOTICE_SIGNAL after the write.
STOP_NOTICE, LAUNCHER_PID = "TRAINWISE_STOP_NOTICE", "TRAINWISE_LAUNCHER_PID"
NOTICE_SIGNAL = signal.SIGUSR2


class StopSignals:
    """Context manager: while active, STOP_SIGNALS set a stop request instead of ending the
    process. `requested()` says, at a step boundary, which signal asked to stop (the same
    answer on every rank of `group`'s job), or None."""

    def __init__(self, distributed: bool = False, device=None):
        self.received: int | None = None
        self._distributed, self._device = distributed, device
        self._told_launcher = False
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
        agreed = int(flag.item()) or None
        if agreed and self.received is None and not self._told_launcher:
            self._told_launcher = True
            tell_launcher(agreed)
        return agreed

    def _on_signal(self, signum: int, frame) -> None:
        if self.received == signum and not self._distributed:
            # A second one of the same kind: stop now, as the signal's default action does.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.received is None:
            self.received = signum


def tell_launcher(signum: int) -> None:
    """Tell this node's launcher (when it asked, see STOP_NOTICE) that the job stops on
    `signum`, which another node received."""
    notice, launcher = os.environ.get(STOP_NOTICE), os.environ.get(LAUNCHER_PID)
    if not notice or not launcher:
        return
    temporary = Path(f"{notice}.{os.getpid()}")  # ranks of one node may write at once
    temporary.write_text(str(signum))
    os.replace(temporary, notice)
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(launcher), NOTICE_SIGNAL)


def start_relaying_child(command: list[str], env: dict, **popen_args) -> subprocess.Popen:
    """Start `command` (torchrun) in its own session, told to pass every stop signal on to
    its workers: a terminal's Ctrl-C then reaches it once, through `relaying_stop_signals`,
    not twice (once from the terminal's process group, once from us). Should this process
    die without relaying (SIGKILL, the OOM killer), torchrun gets SIGTERM from the kernel
    and the job stops after its step and saves, instead of training on as an orphan
    (common/parent_death.py)."""
    return subprocess.Popen(command, env={**env, "TORCHELASTIC_SIGNALS_TO_HANDLE": TORCHRUN_RELAYS},
                            start_new_session=True, preexec_fn=child_stopping_with(os.getpid()), **popen_args)


@contextlib.contextmanager
def relaying_stop_signals(child: subprocess.Popen, notice: Path | None = None) -> Iterator[list[int]]:
    """While active, each stop signal this process gets is sent on to `child`; yields the
    list of the signals relayed so far (see `exit_code_after`). With `notice`, a stop the
    workers agreed with other nodes (see `tell_launcher`) is relayed too, unless one was."""
    relayed: list[int] = []
    from_peer: list[int] = []  # a stop relayed for another node: this node's own copy may follow

    def relay(signum, frame):
        if from_peer and from_peer.pop() == signum:
            return  # the scheduler signalled every node (Slurm): torchrun has it already, once
        relayed.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    def peer_stop(signum, frame):
        try:
            stop = int(notice.read_text())
        except (OSError, ValueError):
            return
        if not relayed:
            print(f"trainwise: another node was stopped by {signal.Signals(stop).name}; this node's ranks stop "
                  "after the same step and save", file=sys.stderr, flush=True)
            relay(stop, frame)
            from_peer.append(stop)

    previous = {signum: signal.signal(signum, relay) for signum in STOP_SIGNALS}
    if notice is not None:
        previous[NOTICE_SIGNAL] = signal.signal(NOTICE_SIGNAL, peer_stop)
    try:
        yield relayed
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def exit_code_after(code: int, relayed: list[int]) -> int:
    """The job's exit code: 128 + the first signal relayed when the job ended on one."""
    return 128 + relayed[0] if relayed and code != 0 else code
