"""The nodes of a job: `trainwise train ... --nnodes N --node-rank R --rdzv-endpoint HOST:PORT --nproc G`.

Every node runs the same command (only --node-rank differs); each starts torchrun for its
G processes with the c10d rendezvous at HOST:PORT, where the N torchrun agents meet and
agree on the ranks (HOST is usually the first node; its agent serves the rendezvous store
when HOST names it). The job's world size is N x G and its layout covers all of it.

The rendezvous id must be the same on every node and differ between jobs that share an
endpoint: --rdzv-id, else a digest of the command line less the flags that name the node
(under Slurm, `--rdzv-id $SLURM_JOB_ID` is the natural choice).

c10d assigns group ranks in the order the agents join, so --node-rank names a node for its
checks and messages; the ranks a node's processes get may differ from R x G + local rank.
"""

from __future__ import annotations

import hashlib
import re

from trainwise.common.errors import InputError
from trainwise.engine.parallel.mesh import under_torchrun
from trainwise.engine.run_config import RunConfig

# The flags that differ between nodes or that torchrun takes in place of the workers.
NODE_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id")
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
_ENDPOINT = re.compile(rf"^({_HOST}):(\d{{1,5}})$")


def is_multinode(run: RunConfig) -> bool:
    return run.nnodes > 1


def check_nodes(run: RunConfig, plan) -> int:
    """The job's world size (processes on all nodes), or InputError naming the node flag
    that cannot work: N >= 1, 0 <= R < N, HOST:PORT, N x G a multiple of the layout's degrees."""
    if run.node_rank >= run.nnodes:
        raise InputError("--node-rank", f"must be 0 to {run.nnodes - 1} with --nnodes {run.nnodes} "
                                        f"(got {run.node_rank})")
    if not is_multinode(run):
        for flag, value in (("--rdzv-endpoint", run.rdzv_endpoint), ("--rdzv-id", run.rdzv_id)):
            if value is not None:
                raise InputError(flag, "is for --nnodes 2 or more (one node meets no other; drop it)")
        return plan.nproc
    if under_torchrun():
        raise InputError("--nnodes", "is for `trainwise train` starting torchrun itself; under a torchrun you "
                                     "started, give torchrun its own --nnodes and --rdzv-endpoint")
    if run.rdzv_endpoint is None:
        raise InputError("--rdzv-endpoint", f"is needed with --nnodes {run.nnodes}: HOST:PORT where every node's "
                                            "torchrun meets (e.g. the first node's address and a free port)")
    endpoint_parts(run.rdzv_endpoint)
    world = run.nnodes * plan.nproc
    named = plan.dp * plan.fsdp * plan.tp * plan.pp
    if world % named:
        raise InputError("--nnodes", f"--nnodes x --nproc = {run.nnodes} x {plan.nproc} = {world} processes must "
                                     f"be a multiple of dp x fsdp x tp x pp = {plan.dp} x {plan.fsdp} x {plan.tp} "
                                     f"x {plan.pp} = {named}")
    return world


def endpoint_parts(text: str) -> tuple[str, int]:
    """(host, port) of a HOST:PORT endpoint ([v6 address]:PORT too), or InputError."""
    match = _ENDPOINT.match(text)
    port = int(match.group(2)) if match else 0
    if match is None or not 1 <= port <= 65535:
        raise InputError("--rdzv-endpoint", f"must be HOST:PORT with a port 1 to 65535, e.g. node0:29500 "
                                            f"(got {text!r})")
    return match.group(1), port


def rendezvous_id(run: RunConfig, argv: list[str]) -> str:
    """--rdzv-id, else `trainwise-` and a digest of `argv` less the flags that name the
    node, and less --resume: the same on every node that runs the same command, and for a
    lost node started again with --resume to rejoin its job."""
    if run.rdzv_id is not None:
        return run.rdzv_id
    shared = " ".join(word for word in without_flags(argv, NODE_FLAGS) if word != "--resume")
    return "trainwise-" + hashlib.sha256(shared.encode()).hexdigest()[:16]


def torchrun_node_arguments(run: RunConfig, nproc: int, argv: list[str]) -> list[str]:
    """torchrun's arguments that say which nodes meet: standalone for one node, else c10d."""
    if not is_multinode(run):
        return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc)]
    return ["--nnodes", str(run.nnodes), "--node-rank", str(run.node_rank), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", run.rdzv_endpoint,
            "--rdzv-id", rendezvous_id(run, argv)]


def without_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` less each of `flags` and its value (`--flag V` or `--flag=V`)."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in flags:
            skip = True
        elif not word.startswith(tuple(f + "=" for f in flags)):
            kept.append(word)
    return kept
