"""A process that stops when the process that started it dies.

A job of several processes is a chain: `trainwise train --nproc N` starts torchrun, and
torchrun starts a worker per rank, each in a session of its own (torchrun's choice, and
the launcher's, so that a terminal's Ctrl-C reaches each once: engine/preemption.py). A
signal the parent can catch is passed down the chain; one it cannot (SIGKILL from a user
or the OOM killer, a crash) ended the parent alone, and its children trained on, orphans,
writing checkpoints into the output that a resumed run was by then using.

Linux sends a chosen signal to a process when its parent dies (prctl PR_SET_PDEATHSIG).
The signal chosen is SIGTERM: the stop signal a scheduler sends, so an orphaned torchrun
passes it to its workers and the workers stop after the step they are in and save
(engine/preemption.py), as on any other stop. Elsewhere (macOS) nothing is set."""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl():
    """libc's prctl, looked up now: a child between fork and exec must not load libraries."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def stop_with_parent(signum: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """Ask the kernel to send `signum` to this process when its parent dies; whether it
    could (Linux only). A parent that died before the request was made (this process was
    handed to init or a subreaper: its parent is no longer `parent`) sends it at once."""
    if _PRCTL is None or _PRCTL(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)
    return True


def child_stopping_with(parent: int, signum: int = signal.SIGTERM):
    """A `preexec_fn` for subprocess.Popen: the child stops (`signum`) when `parent` dies."""
    def preexec() -> None:
        stop_with_parent(signum, parent)
    return preexec
