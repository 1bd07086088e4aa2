"""`trainwise train ... --nproc N`: start N processes on this node with torchrun.

The command re-runs itself under `python -m torch.distributed.run`, which sets RANK,
WORLD_SIZE and LOCAL_RANK, watches the workers and stops them all when one fails. Across
nodes, every node runs the same command with `--nnodes M --node-rank R --rdzv-endpoint
HOST:PORT` and its torchrun joins the others through the c10d rendezvous
(trainwise.engine.parallel.nodes):

    trainwise train MODEL --fsdp 16 --nproc 8 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from trainwise.engine.preemption import LAUNCHER_PID, STOP_NOTICE
from trainwise.engine.parallel.mesh import under_torchrun
from trainwise.engine.parallel.nodes import NODE_FLAGS, is_multinode, torchrun_node_arguments, without_flags
from trainwise.engine.parallel.supervise import watch_job
from trainwise.engine.run_config import RunConfig


def should_launch(nproc: int, run: RunConfig | None = None) -> bool:
    """Whether this process starts torchrun: several processes here, or several nodes."""
    return (nproc > 1 or (run is not None and is_multinode(run))) and not under_torchrun()


def without_nproc(argv: list[str]) -> list[str]:
    """`argv` less its --nproc flag and the node flags: torchrun's parser reads every word of
    the command and takes --nproc for an ambiguous abbreviation of its own --nproc-per-node.
    The workers learn the process count and their rank from torchrun (WORLD_SIZE, RANK)."""
    return without_flags(argv, NODE_FLAGS)


def torchrun_command(nproc: int, argv: list[str], run: RunConfig) -> list[str]:
    """The torchrun command line that runs `trainwise <argv>` on this node's `nproc` processes."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_node_arguments(run, nproc, argv),
            "--max-restarts", str(run.max_restarts), "-m", "trainwise", *without_nproc(argv)]


def launch_local(nproc: int, argv: list[str], run: RunConfig | None = None) -> int:
    """Run `trainwise <argv>` on `nproc` local processes (this node's share of the job under
    --nnodes); the exit code of this node's part of the job.

    One worker failing ends the others (torchrun's agent stops the group) and its
    `trainwise: error: ...` line is on stderr, then one line naming the rank; the job's
    exit code is then 1. With `run.max_restarts` R, torchrun restarts the group up to R
    times instead (see trainwise.engine.parallel.restarts). A stop signal reaches every
    worker: they save at the same step and the code is 128 + the signal; across nodes, a
    signal to one node's launcher stops every node (trainwise.engine.preemption)."""
    run = run or RunConfig()
    command = torchrun_command(nproc, argv, run)
    # One OpenMP thread per worker unless the user chose: N workers share the cores.
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    if run.max_restarts:
        # Else torchrun's agent shares one key-value store with every attempt's workers, and
        # a restarted rank can read the address a dead rank of the failed attempt published.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if not is_multinode(run):
        return watch_job(command, env, run)
    with tempfile.TemporaryDirectory(prefix="trainwise-stop-") as directory:
        notice = Path(directory) / "stop"
        env.update({STOP_NOTICE: str(notice), LAUNCHER_PID: str(os.getpid())})
        return watch_job(command, env, run, notice)
