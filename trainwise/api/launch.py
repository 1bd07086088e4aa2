"""`trainwise train --nproc N` / `--nnodes M`: whether this process starts torchrun, the
launch with what auto chose pinned into the workers' command line, a restarted worker's
continuation, and the process group stopped when the run ends (engine/parallel/)."""

from __future__ import annotations

import os
from typing import Callable

from trainwise.engine.run_config import RunConfig
from trainwise.plan.auto_request import AutoRequest
from trainwise.plan.plan import Plan


def launches(plan: Plan, run_config: RunConfig) -> bool:
    """Whether this process starts torchrun instead of training (engine/parallel/launch.py)."""
    from trainwise.engine.parallel.launch import should_launch

    return should_launch(plan.nproc, run_config)


def launch(argv: list[str], plan: Plan, run_config: RunConfig, auto: AutoRequest) -> int:
    """Start torchrun for this node's processes, each running `argv` with auto's choice
    written out as flags; the exit code of this node's part of the job."""
    from trainwise.api.auto_choice import pinned_argv
    from trainwise.engine.parallel.launch import launch_local

    workers = pinned_argv(argv, plan, auto) if auto.plan or auto.batch else argv
    return launch_local(plan.nproc, workers, run_config)


def continue_after_restart(run_config: RunConfig, say: Callable[[str], None]) -> RunConfig:
    """A worker restarted by torchrun continues from this job's newest checkpoint. The
    `trainwise train --nproc` launcher announces each restart; under a torchrun started by
    hand, rank 0 does (through `say`)."""
    from trainwise.engine.parallel.restarts import (MAX_RESTARTS, launched_by_trainwise, restart_attempt,
                                                    restart_line, run_for_this_attempt)

    continued, checkpoint = run_for_this_attempt(run_config)
    if restart_attempt() and not launched_by_trainwise() and os.environ.get("RANK", "0") == "0":
        say(restart_line(restart_attempt(), int(os.environ.get(MAX_RESTARTS, "0") or 0), checkpoint, None))
    return continued


def stop_distributed() -> None:
    """Leave the process group, if the run joined one (engine/parallel/mesh.py)."""
    from trainwise.engine.parallel.mesh import stop_distributed as stop

    stop()
