"""`trainwise train --nnodes N --node-rank R --rdzv-endpoint HOST:PORT --nproc G`: each node
starts torchrun for its G processes, meeting the other nodes at a c10d rendezvous.

The fast tests check the torchrun command built for a node and the refusals; the
distributed ones run two "nodes" as two `trainwise train` processes on localhost."""

from __future__ import annotations

import json
import sys
import time

import pytest

from trainwise.cli.main import main
from trainwise.engine.parallel import restarts
from trainwise.engine.parallel.launch import torchrun_command
from trainwise.engine.parallel.nodes import rendezvous_id
from trainwise.engine.run_config import RunConfig

ARGV = ["train", "tiny-llama", "--fsdp", "4", "--nproc", "2", "--nnodes", "2", "--node-rank", "1",
        "--rdzv-endpoint", "node0:29500", "--max-restarts", "1", "--output", "/shared/run"]


def _node_run(rank: int, **more) -> RunConfig:
    return RunConfig.from_dict({"nnodes": 2, "node_rank": rank, "rdzv_endpoint": "node0:29500",
                                "max_restarts": 1, "output": "/shared/run", **more})


def test_a_node_starts_torchrun_with_the_c10d_rendezvous_and_its_own_processes():
    command = torchrun_command(2, ARGV, _node_run(1))
    node_id = rendezvous_id(_node_run(1), ARGV)
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[3:command.index("-m", 3)] == [
        "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "node0:29500", "--rdzv-id", node_id, "--max-restarts", "1"]
    # The workers get the command less the flags torchrun answers (their rank, the world size).
    assert command[command.index("-m", 3):] == ["-m", "trainwise", "train", "tiny-llama", "--fsdp", "4",
                                                "--max-restarts", "1", "--output", "/shared/run"]


def test_every_node_of_a_job_derives_the_same_rendezvous_id_and_another_job_another():
    node0 = [w if w != "1" or ARGV[i - 1] != "--node-rank" else "0" for i, w in enumerate(ARGV)]
    assert rendezvous_id(_node_run(0), node0) == rendezvous_id(_node_run(1), ARGV)
    other_job = [*ARGV[:-1], "/shared/other-run"]
    assert rendezvous_id(_node_run(1), other_job) != rendezvous_id(_node_run(1), ARGV)
    assert rendezvous_id(_node_run(1, rdzv_id="slurm-4242"), ARGV) == "slurm-4242"


def test_one_node_is_launched_standalone_as_before():
    command = torchrun_command(2, ["train", "tiny-llama", "--nproc", "2"], RunConfig())
    assert command[3:command.index("-m", 3)] == ["--standalone", "--nnodes", "1", "--nproc-per-node", "2",
                                                 "--max-restarts", "0"]


@pytest.mark.parametrize("flags, expected", [
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"],
     "--node-rank: must be 0 to 1 with --nnodes 2 (got 2)"),
    (["--nnodes", "0"], "--nnodes: must be an int >= 1"),
    (["--nnodes", "2", "--node-rank", "1"], "--rdzv-endpoint: is needed with --nnodes 2: HOST:PORT where every "
                                            "node's torchrun meets (e.g. the first node's address and a free port)"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0"],
     "--rdzv-endpoint: must be HOST:PORT with a port 1 to 65535, e.g. node0:29500 (got 'node0')"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0:70000"],
     "--rdzv-endpoint: must be HOST:PORT with a port 1 to 65535, e.g. node0:29500 (got 'node0:70000')"),
    (["--rdzv-endpoint", "node0:29500"], "--rdzv-endpoint: is for --nnodes 2 or more (one node meets no other; "
                                         "drop it)"),
    (["--nnodes", "3", "--rdzv-endpoint", "node0:29500"],
     "--nnodes: --nnodes x --nproc = 3 x 2 = 6 processes must be a multiple of dp x fsdp x tp x pp = "
     "1 x 1 x 2 x 2 = 4"),
])
def test_node_settings_that_cannot_make_a_job_are_refused_before_any_launch(capsys, flags, expected):
    code = main(["train", "tiny-llama", "--device", "cpu", "--nproc", "2", "--tp", "2", "--pp", "2", *flags])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"trainwise: error: {expected}"), lines


def test_a_healthy_nodes_workers_restarted_for_a_new_round_continue_from_the_jobs_checkpoint(tmp_path, monkeypatch):
    """When a rank of another node fails, this node's agent restarts its healthy workers for
    the new rendezvous round without counting a restart (TORCHELASTIC_RESTART_COUNT stays
    0): they must still continue from the job's checkpoint, with the failed node's ranks."""
    started = time.time_ns()
    run = RunConfig.from_dict({"max_restarts": 1, "output": str(tmp_path), "save_every": 2})
    monkeypatch.setenv(restarts.RESTART_COUNT, "0")
    monkeypatch.setenv(restarts.JOB_STARTED, str(started))
    assert restarts.run_for_this_attempt(run) == (run, None)  # the job's first workers start as asked
    checkpoint = tmp_path / "checkpoints" / "step-00000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"")
    (checkpoint / "trainwise.json").write_text(json.dumps({"state": {"step": 2}, "saved_ns": started + 1}))
    assert restarts.run_for_this_attempt(run) == (run.replace(resume=True), checkpoint)
