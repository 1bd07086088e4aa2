"""A launched job's processes, for the tests that kill one: `trainwise train --nproc N`
starts torchrun and torchrun a worker per rank, each in a session of its own, so killing
the launcher's process group reaches none of them (Linux: read from /proc)."""

from __future__ import annotations

import os
import signal


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, directly or through others, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # ended while listed
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_job(pid: int) -> None:
    """SIGKILL `pid` and everything it started, the workers first: the whole job at once, as
    a lost node ends it, with no process left to stop gracefully."""
    for each in [*reversed(descendants(pid)), pid]:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass
