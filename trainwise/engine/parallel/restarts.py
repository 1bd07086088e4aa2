"""Restarting a multi-process job after one of its processes fails (`--max-restarts R`).

torchrun restarts the whole group of workers, up to R times, when any one of them fails
(killed, out of memory, an error). Every restarted worker sees TORCHELASTIC_RESTART_COUNT
> 0 and continues from the newest complete checkpoint *of this job* in --out: one saved
after the job started, or the one an explicit --resume began from. A checkpoint left in a
reused --out by an earlier job is not taken for this job's progress; with none, the
restart starts over from step 0 (and so does its metrics file). Across nodes, each node's
launcher clock is compared with the saving rank's: they must agree to better than the time
before the first save.

The job's start time comes from the `trainwise train --nproc` launcher (TRAINWISE_JOB_STARTED_NS);
under a torchrun started by hand it is unknown, and the newest checkpoint is taken.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainwise.engine.checkpoint import INFO_FILE, latest_checkpoint
from trainwise.engine.parallel.mesh import under_torchrun
from trainwise.engine.run_config import RunConfig
from trainwise.common.errors import InputError

RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
JOB_STARTED = "TRAINWISE_JOB_STARTED_NS"


def check_restart_request(run: RunConfig, nproc: int) -> str | None:
    """Raise InputError for a --max-restarts that cannot work for a job of `nproc`
    processes (on all nodes); return a warning line for one that can only start over (no
    checkpoint before the end), else None."""
    if not run.max_restarts or launched_by_trainwise():
        return None
    if under_torchrun():
        raise InputError("--max-restarts", "is for `trainwise train --nproc N`; under a torchrun you started, "
                                           "give torchrun its own --max-restarts")
    if nproc < 2:
        raise InputError("--max-restarts", "needs --nproc 2 or more (a single process is not restarted; "
                                           "continue it with --resume)")
    if not run.output:
        raise InputError("--max-restarts", "needs --out DIR: a restarted job continues from the "
                                           "checkpoints saved there")
    if not run.save_every:
        start = "the checkpoint --resume starts from" if run.resume else "step 0"
        return (f"trainwise: warning: --max-restarts without --save-every N saves no checkpoint before the end: "
                f"a restart starts over from {start}")
    return None


def launched_by_trainwise() -> bool:
    return JOB_STARTED in os.environ


def restart_attempt() -> int:
    """0 for the job's first attempt, k for its k-th restart."""
    return int(os.environ.get(RESTART_COUNT, "0") or 0)


def checkpoint_to_continue(output, resume: bool, started_ns: int | None) -> Path | None:
    """The checkpoint a restart of this job continues from, or None (start over)."""
    path = latest_checkpoint(output)
    if path is None or resume or started_ns is None:
        return path
    return path if _saved_ns(path) >= started_ns else None


def run_for_this_attempt(run: RunConfig) -> tuple[RunConfig, Path | None]:
    """`run` as this worker must run it, and the checkpoint it continues from: a restarted
    worker resumes from this job's newest checkpoint when there is one.

    Under `trainwise train`'s launcher the attempt count is not asked: across nodes, when a
    rank of one node fails, only that node's agent counts a restart; the other agents restart
    their healthy workers for the new rendezvous round with TORCHELASTIC_RESTART_COUNT
    unchanged, and those workers must continue from the same checkpoint. A job's first
    workers find no checkpoint saved after the job started, so they start as asked."""
    if not run.output or (restart_attempt() == 0 and not launched_by_trainwise()):
        return run, None
    started = os.environ.get(JOB_STARTED)
    found = checkpoint_to_continue(run.output, run.resume, int(started) if started else None)
    return (run.replace(resume=True), found) if found is not None else (run, None)


def restart_line(attempt: int, max_restarts: int | None, checkpoint: Path | None, failed: str | None) -> str:
    """The one line a user sees for a restart, e.g. `trainwise: rank 1 failed (killed by
    SIGKILL); restart 1 of 2, resuming from step 4`."""
    what = f"{failed}; " if failed else "a process of the job failed; "
    of = f" of {max_restarts}" if max_restarts else ""
    if checkpoint is None:
        return f"trainwise: {what}restart {attempt}{of}, starting over from step 0 (no checkpoint of this job yet)"
    return f"trainwise: {what}restart {attempt}{of}, resuming from step {checkpoint_step(checkpoint)}"


def checkpoint_step(path: Path) -> int | str:
    """Steps completed at checkpoint `path` (from its trainwise.json; its name otherwise)."""
    try:
        return int(json.loads((Path(path) / INFO_FILE).read_text())["state"]["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return Path(path).name


def _saved_ns(path: Path) -> int:
    try:
        return int(json.loads((path / INFO_FILE).read_text()).get("saved_ns", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0
