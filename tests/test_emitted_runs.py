"""The sbatch script of `plan --emit slurm` runs: under a stand-in `srun` (one copy of its
command per node, all on this host, SLURM_NODEID set) and a stand-in `scontrol` (every
host is localhost), two "nodes" of one process each meet through torchrun's c10d
rendezvous and train a tiny model for two steps into the script's output directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed_launch import REPO, free_port
from trainwise.plan import Plan
from trainwise.planner.emit import emit
from trainwise.planner.launch import Launch

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
    path = f"{_stand_ins(tmp_path / 'bin')}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "SLURM_NNODES": "2", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_SUBMIT_DIR": str(tmp_path), "RDZV_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    job = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = job.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)  # the stand-in srun's torchruns are in the same session
        raise
    assert job.returncode == 0, log[-3000:]
    assert "step 2/2" in log and missing == []
    assert (output / "final").is_dir() and (output / "checkpoints" / "step-00000002").is_dir()
