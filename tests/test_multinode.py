"""`trainwise train --nnodes N --node-rank R --rdzv-endpoint HOST:PORT --nproc G`: each node
starts torchrun for its G processes, meeting the other nodes at a c10d rendezvous.

The fast tests check the torchrun command built for a node and the refusals; the
distributed ones run two "nodes" as two `trainwise train` processes on localhost."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from pathlib import Path

import pytest

from distributed_launch import REPO, free_port
from trainwise.api.training import train
from trainwise.cli.main import main
from trainwise.engine.checkpoint import latest_checkpoint
from trainwise.engine.parallel import restarts
from trainwise.engine.parallel.launch import torchrun_command
from trainwise.engine.parallel.nodes import rendezvous_id
from trainwise.engine.run_config import RunConfig
from trainwise.plan.plan import Plan

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
    assert rendezvous_id(_node_run(1), [*ARGV, "--resume"]) == rendezvous_id(_node_run(1), ARGV)  # a node rejoining
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



def test_a_stop_another_node_received_is_relayed_once_to_this_nodes_torchrun(tmp_path, monkeypatch, capsys):
    """A rank that learns from the all-reduce of a stop signal its node was not sent tells
    its launcher, which relays that signal to its torchrun once (so its agent lets the
    workers save rather than restarting them) and ends with 128 + the signal."""
    from trainwise.engine.preemption import (LAUNCHER_PID, STOP_NOTICE, exit_code_after, relaying_stop_signals,
                                             tell_launcher)

    notice = tmp_path / "stop"
    monkeypatch.setenv(STOP_NOTICE, str(notice))
    monkeypatch.setenv(LAUNCHER_PID, str(os.getpid()))
    child = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
                              "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        with relaying_stop_signals(child, notice) as relayed:
            tell_launcher(signal.SIGTERM)  # a rank of this node, after the all-reduce
            tell_launcher(signal.SIGINT)  # another rank's notice, once one was relayed: ignored
            os.kill(os.getpid(), signal.SIGTERM)  # this node's own copy (a scheduler signals every node)
            assert child.wait(timeout=30) == 7
        assert relayed == [signal.SIGTERM]
        assert exit_code_after(7, relayed) == 143
    finally:
        child.kill()
    assert capsys.readouterr().err == ("trainwise: another node was stopped by SIGTERM; this node's ranks stop "
                                       "after the same step and save\n")

STEPS = 6  # checkpoints after steps 2 and 4 where saved; the killed rank dies starting step 4
COMMON = ["tiny-llama", "--device", "cpu", "--data", "synthetic", "--batch-size", "2", "--seq-len", "16",
          "--lr", "1e-3", "--warmup-steps", "2", "--steps", str(STEPS), "--log-every", "1", "--nproc", "2",
          "--nnodes", "2"]
# Active only on the node whose environment names it: its local rank 1 SIGKILLs itself as it
# starts step 4 of the job's first attempt.
SITECUSTOMIZE = '''
import os
import signal

if os.environ.get("TRAINWISE_TEST_KILL_LOCAL_RANK") == os.environ.get("LOCAL_RANK") \\
        and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    import trainwise.engine.train_step as train_step

    _original, _calls = train_step.training_step, [0]

    def training_step(*args, **kwargs):
        _calls[0] += 1
        if _calls[0] == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return _original(*args, **kwargs)

    train_step.training_step = training_step
'''


def _start_node(tmp_path, rank: int, endpoint: str, args: list[str], extra_env: dict | None = None):
    """`trainwise train COMMON args` as node `rank`, in a session of its own."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{hooks}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", **(extra_env or {})}
    command = [sys.executable, "-m", "trainwise", "train", *COMMON, *args, "--node-rank", str(rank),
               "--rdzv-endpoint", endpoint]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(nodes) -> list[subprocess.CompletedProcess]:
    """Each node's outcome; a node still running after the timeout is killed whole."""
    done = []
    try:
        for node in nodes:
            stdout, stderr = node.communicate(timeout=480)
            done.append(subprocess.CompletedProcess(node.args, node.returncode, stdout, stderr))
    finally:
        for node in nodes:
            if node.poll() is None:
                _kill_tree(node.pid)
    return done


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process under it (torchrun runs in a session of its own)."""
    for child in _children(pid):
        _kill_tree(child)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(word) for word in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _two_nodes(tmp_path, args: list[str], node1_env: dict | None = None,
               during=None) -> list[subprocess.CompletedProcess]:
    """Node 0 and node 1 on localhost, meeting at a free port; `during(nodes)` is called once
    both are started."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [_start_node(tmp_path, 0, endpoint, args), _start_node(tmp_path, 1, endpoint, args, node1_env)]
    try:
        if during is not None:
            during(nodes)
    except BaseException:
        for node in nodes:
            _kill_tree(node.pid)
        raise
    return _finish(nodes)


def _losses(metrics) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [(line["step"], line["loss"]) for line in lines if "step" in line]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> list[tuple[int, float]]:
    """The loss curve of one process taking every rank's samples (2 data-parallel ranks: x 2
    accumulation)."""
    metrics = tmp_path_factory.mktemp("one") / "metrics.jsonl"
    train("tiny-llama", plan=Plan.from_dict({"batch_size": 2, "grad_accum": 2, "seq_len": 16, "lr": 1e-3,
                                             "warmup_steps": 2, "device": "cpu"}),
          run=RunConfig.from_dict({"steps": STEPS, "data": "synthetic", "metrics": str(metrics)}))
    return _losses(metrics)


def _assert_same_curve(got, want) -> None:
    assert [step for step, _ in got] == list(range(1, STEPS + 1))  # none missing, none twice
    for (step, loss), (_, expected) in zip(got, want):
        assert loss == pytest.approx(expected, rel=1e-4), step


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_killed_on_one_node_restarts_every_node_from_the_checkpoint_with_the_same_losses(tmp_path,
                                                                                               one_process):
    output, metrics = tmp_path / "run", tmp_path / "metrics.jsonl"
    nodes = _two_nodes(tmp_path, ["--pp", "2", "--microbatches", "2", "--max-restarts", "1", "--save-every", "2",
                                  "--output", str(output), "--metrics", str(metrics)],
                       node1_env={"TRAINWISE_TEST_KILL_LOCAL_RANK": "1"})
    for node in nodes:
        assert node.returncode == 0, node.stderr[-3000:]
    announced = [line for line in nodes[1].stderr.splitlines() if line.startswith("trainwise:") and "restart" in line]
    assert len(announced) == 1 and announced[0].endswith("(killed by SIGKILL); restart 1 of 1, resuming from step 2")
    _assert_same_curve(_losses(metrics), one_process)
    # The job's last checkpoint is complete (a pipeline run exports no final/: its stages hold parts).
    assert restarts.checkpoint_step(latest_checkpoint(output)) == STEPS


@pytest.mark.slow
@pytest.mark.distributed
def test_a_stop_signal_to_one_nodes_launcher_stops_every_rank_of_every_node_after_the_same_step(tmp_path):
    output, metrics = tmp_path / "run", tmp_path / "metrics.jsonl"

    def preempt_node_1(nodes):
        deadline = time.monotonic() + 400
        while not (metrics.is_file() and _losses(metrics)) and time.monotonic() < deadline:
            time.sleep(0.5)
        nodes[1].send_signal(signal.SIGTERM)  # as a scheduler would, to this node only

    nodes = _two_nodes(tmp_path, ["--steps", "60", "--output", str(output), "--metrics", str(metrics)],
                       during=preempt_node_1)
    assert [node.returncode for node in nodes] == [143, 143], [node.stderr[-2000:] for node in nodes]
    assert "trainwise: another node was stopped by SIGTERM; this node's ranks stop after the same step and save" \
        in nodes[0].stderr
    stopped_after = _losses(metrics)[-1][0]
    assert stopped_after < 60
    assert restarts.checkpoint_step(latest_checkpoint(output)) == stopped_after


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _wait_for(condition, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_train_fsdp_tp_sp_like_one_process_through_the_loss_and_rejoining_of_a_whole_node(tmp_path,
                                                                                                  one_process):
    """FSDP 2 x TP 2 with sequence parallel over two nodes of 2 ranks. Node 1 (its launcher,
    agent and ranks) is killed after the first checkpoint; node 0's agent restarts its ranks
    (--max-restarts 1) and waits in a new rendezvous round, which node 1, started again with
    --resume, joins. Every step's loss equals one process's. Node 0 serves the rendezvous
    store (it is started first), as the node named by --rdzv-endpoint does on a cluster."""
    output, metrics = tmp_path / "run", tmp_path / "metrics.jsonl"
    args = ["--fsdp", "2", "--tp", "2", "--sequence-parallel", "--max-restarts", "1", "--save-every", "2", "--output", str(output), "--metrics", str(metrics)]
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    node0 = _start_node(tmp_path, 0, endpoint, args)
    nodes = [node0]
    try:
        _wait_for(lambda: _listening(port))  # node 0's agent serves the rendezvous store
        node1 = _start_node(tmp_path, 1, endpoint, args)
        _wait_for(lambda: latest_checkpoint(output) is not None)
        _kill_tree(node1.pid)
        node1.communicate()
        nodes.append(_start_node(tmp_path, 1, endpoint, [*args, "--resume"]))
    finally:
        done = _finish(nodes)
    for node in done:
        assert node.returncode == 0, node.stderr[-3000:]
    _assert_same_curve(_losses(metrics), one_process)
    assert restarts.checkpoint_step(latest_checkpoint(output)) == STEPS
