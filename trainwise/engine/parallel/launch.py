"""`trainwise train ... --nproc N`: start N processes on this node with torchrun.

The command re-runs itself under `python -m torch.distributed.run`, which sets RANK,
WORLD_SIZE and LOCAL_RANK, watches the workers and stops them all when one fails. Across
nodes, run torchrun directly on every node (trainwise then does not relaunch):

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 \\
        --rdzv-backend c10d --rdzv-endpoint HOST0:29500 -m trainwise train MODEL --fsdp 16 ...
"""

from __future__ import annotations

import os
import sys

from trainwise.engine.parallel.mesh import under_torchrun
from trainwise.engine.parallel.supervise import watch_job
from trainwise.engine.run_config import RunConfig


def should_launch(nproc: int) -> bool:
    return nproc > 1 and not under_torchrun()


def without_nproc(argv: list[str]) -> list[str]:
    """`argv` less its --nproc flag: torchrun's parser reads every word of the command and
    takes --nproc for an ambiguous abbreviation of its own --nproc-per-node. The workers
    learn the process count from torchrun (WORLD_SIZE) instead."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--nproc":
            skip = True
        elif not word.startswith("--nproc="):
            kept.append(word)
    return kept


def launch_local(nproc: int, argv: list[str], run: RunConfig | None = None) -> int:
    """Run `trainwise <argv>` on `nproc` local processes; the exit code of the job.

    One worker failing ends the others (torchrun's agent stops the group) and its
    `trainwise: error: ...` line is on stderr, then one line naming the rank; the job's
    exit code is then 1. With `run.max_restarts` R, torchrun restarts the group up to R
    times instead (see trainwise.engine.parallel.restarts). A stop signal reaches every
    worker: they save at the same step and the code is 128 + the signal."""
    run = run or RunConfig()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc-per-node", str(nproc), "--max-restarts", str(run.max_restarts),
               "-m", "trainwise", *without_nproc(argv)]
    # One OpenMP thread per worker unless the user chose: N workers share the cores.
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    if run.max_restarts:
        # Else torchrun's agent shares one key-value store with every attempt's workers, and
        # a restarted rank can read the address a dead rank of the failed attempt published.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return watch_job(command, env, run)
