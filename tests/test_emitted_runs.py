"""What `plan --emit` writes runs. The sbatch script of `plan --emit slurm`: under a stand-in
`srun` (one copy of its command per node, all on this host, SLURM_NODEID set) and a
stand-in `scontrol` (every host is localhost), two "nodes" of one process each meet through
torchrun's c10d rendezvous and train a tiny model for two steps into the script's output
directory. The per-node `trainwise train` line `plan` prints: run twice on this host with
NODE_RANK 0 and 1, it trains the same way. The per-node script of `plan --emit torchrun`: run twice on
this host with HEAD_NODE 127.0.0.1, the two "nodes" meet and train."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed_launch import REPO, free_port
from trainwise.plan import Plan
from trainwise.emit.targets import emit
from trainwise.emit.train_line import Launch, train_flags

STAND_IN_SRUN = """#!/bin/bash
# srun for a test: its options are skipped; the command runs once per node, here.
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do
  SLURM_NODEID=$node SLURM_PROCID=$node "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
STAND_IN_SCONTROL = "#!/bin/bash\necho localhost\n"


def _environment(path: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{path}{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), **extra}


def _finish(jobs: list[tuple[subprocess.Popen, Path]], timeout_s: float = 300) -> list[tuple[int, str]]:
    """(exit code, output) of each job; every job's session is killed past `timeout_s`."""
    try:
        codes = [job.wait(timeout=timeout_s) for job, _ in jobs]
    except subprocess.TimeoutExpired:
        for job, _ in jobs:
            # Its torchrun is in the session; the workers, in sessions of their own, stop when
            # torchrun dies (trainwise/common/parent_death.py).
            os.killpg(job.pid, signal.SIGKILL)
        raise
    return [(code, log.read_text()) for code, (_, log) in zip(codes, jobs)]


def _start(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, Path]:
    """The job, its output going to `log` (a file: two jobs waiting on each other never block on a pipe)."""
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True), log


def _stand_ins(directory: Path) -> Path:
    directory.mkdir()
    for name, text in (("srun", STAND_IN_SRUN), ("scontrol", STAND_IN_SCONTROL)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return directory


@pytest.mark.slow
@pytest.mark.distributed
def test_the_sbatch_script_trains_on_two_nodes_under_a_stand_in_srun(tmp_path):
    # --dp 2 needs a world of 2: the run only starts if both "nodes" joined the rendezvous
    plan = Plan(device="cpu", nproc=2, dp=2, batch_size=2, seq_len=32)
    output = tmp_path / "shared" / "run"
    text, missing = emit(plan, "slurm", Launch("tiny-llama", gpus_per_node=1, data="builtin", steps=2,
                                               output=str(output)))
    script = tmp_path / "job.sbatch"
    script.write_text(text + "\n")
    env = _environment(f"{_stand_ins(tmp_path / 'bin')}:", SLURM_NNODES="2", SLURM_JOB_ID="7",
                       SLURM_JOB_NODELIST="node[1-2]", SLURM_SUBMIT_DIR=str(tmp_path), RDZV_PORT=str(free_port()))
    ((code, log),) = _finish([_start(["bash", str(script)], tmp_path, env, tmp_path / "job.log")])
    assert code == 0, log[-3000:]
    assert "step 2/2" in log and missing == []
    assert (output / "final").is_dir() and (output / "checkpoints" / "step-00000002").is_dir()


@pytest.mark.slow
@pytest.mark.distributed
def test_the_per_node_train_line_plan_prints_trains_on_two_nodes(tmp_path):
    plan = Plan(device="cpu", nproc=2, dp=2, batch_size=2, seq_len=32)
    output = tmp_path / "run"
    line = train_flags(plan, Launch("tiny-llama", gpus_per_node=1, data="builtin", steps=2, output=str(output)))
    assert "--nnodes 2" in line and "--nproc 1" in line
    line = line.replace(":29500", f":{free_port()}")  # a free port here, as a user would pick one in use
    env = _environment("", HEAD_NODE="127.0.0.1")
    nodes = [_start(["bash", "-c", line], tmp_path, {**env, "NODE_RANK": str(rank)}, tmp_path / f"node-{rank}.log")
             for rank in (0, 1)]
    for code, log in _finish(nodes):
        assert code == 0, log[-3000:]
    assert (output / "final").is_dir()


@pytest.mark.slow
@pytest.mark.distributed
def test_the_emitted_torchrun_script_trains_when_run_on_two_nodes(tmp_path):
    plan = Plan(device="cpu", nproc=2, dp=2, batch_size=2, seq_len=32)
    output = tmp_path / "run"
    text, missing = emit(plan, "torchrun", Launch("tiny-llama", gpus_per_node=1, data="builtin", steps=2,
                                                  output=str(output)))
    assert "--nnodes 2" in text and "--nproc-per-node 1" in text and missing == []
    script = tmp_path / "node.sh"
    script.write_text(text.replace(":29500", f":{free_port()}") + "\n")  # a free port here, as a user would pick
    env = _environment("", HEAD_NODE="127.0.0.1")
    nodes = [_start(["bash", str(script)], tmp_path, env, tmp_path / f"node-{rank}.log") for rank in (0, 1)]
    for code, log in _finish(nodes):
        assert code == 0, log[-3000:]
    assert (output / "final").is_dir()
