"""When a rank of a `trainwise train --nproc N` job dies (kill -9), the job either
restarts from its newest checkpoint and ends with the loss curve of an uninterrupted run
(`--max-restarts R`), or stops promptly with one line naming the rank.

The fault is injected from outside trainwise: a sitecustomize.py on PYTHONPATH, active
only when this test sets TRAINWISE_TEST_KILL_RANK, makes that rank SIGKILL itself as it
starts step TRAINWISE_TEST_KILL_AT_STEP of the job's first attempt, and come up 3 s late
after the restart (its peers must not take the dead rank's old address for its new one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from distributed_launch import REPO
from job_processes import kill_job
from trainwise.api.training import train
from trainwise.cli.main import main
from trainwise.engine.checkpoint import latest_checkpoint
from trainwise.engine.parallel import restarts
from trainwise.engine.parallel.restarts import check_restart_request, run_for_this_attempt
from trainwise.engine.parallel.supervise import FailureWatcher
from trainwise.engine.run_config import RunConfig
from trainwise.plan.plan import Plan

STEPS, KILL_AT_STEP = 6, 4  # checkpoints after steps 2 and 4; rank 1 dies starting step 4
COMMON = ["tiny-llama", "--nproc", "2", "--device", "cpu", "--data", "synthetic", "--batch-size", "1",
          "--seq-len", "16", "--lr", "1e-3", "--warmup-steps", "2", "--steps", str(STEPS), "--log-every", "1",
          "--save-every", "2"]

SITECUSTOMIZE = '''
import os
import signal

if os.environ.get("TRAINWISE_TEST_KILL_RANK") == os.environ.get("RANK") \\
        and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    import trainwise.engine.train_step as train_step

    _original, _calls = train_step.training_step, [0]

    def training_step(*args, **kwargs):
        _calls[0] += 1
        if _calls[0] == int(os.environ["TRAINWISE_TEST_KILL_AT_STEP"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return _original(*args, **kwargs)

    train_step.training_step = training_step

if os.environ.get("TRAINWISE_TEST_KILL_RANK") == os.environ.get("RANK") \\
        and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "1":
    import time

    time.sleep(3)  # the restarted rank comes up late, as on a busy node: its peers wait for it
'''


def _train_killing_rank_1(tmp_path, args: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{hooks}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "TRAINWISE_TEST_KILL_RANK": "1",
           "TRAINWISE_TEST_KILL_AT_STEP": str(KILL_AT_STEP)}
    started = time.monotonic()
    # A hung job is ended whole: torchrun and each worker are in sessions of their own.
    with subprocess.Popen([sys.executable, "-m", "trainwise", "train", *COMMON, *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True) as job:
        try:
            stdout, stderr = job.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            kill_job(job.pid)
            raise
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr), time.monotonic() - started


def _trainwise_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("trainwise:")]


def _steps(metrics) -> list[dict]:
    return [line for line in map(json.loads, metrics.read_text().splitlines()) if "step" in line]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.fault
def test_a_killed_rank_restarts_the_job_from_its_checkpoint_with_the_same_loss_curve(tmp_path, fault_log):
    output = tmp_path / "run"
    output.mkdir()
    (output / "notes.txt").write_text("the user's own file\n")
    fault_log.watch(output / "notes.txt")
    metrics = tmp_path / "restarted.jsonl"
    done, _ = _train_killing_rank_1(tmp_path, ["--max-restarts", "2", "--output", str(output),
                                               "--metrics", str(metrics)])
    assert done.returncode == 0, done.stderr[-3000:]
    announced = [line for line in _trainwise_lines(done.stderr) if "restart" in line]
    assert announced == ["trainwise: rank 1 failed (killed by SIGKILL); restart 1 of 2, resuming from step 2"]

    # The uninterrupted run: the same 2 samples per step in one process.
    reference = tmp_path / "reference.jsonl"
    train("tiny-llama", plan=Plan.from_dict({"batch_size": 1, "grad_accum": 2, "seq_len": 16, "lr": 1e-3,
                                             "warmup_steps": 2, "device": "cpu"}),
          run=RunConfig.from_dict({"steps": STEPS, "data": "synthetic", "metrics": str(reference)}))
    restarted, uninterrupted = _steps(metrics), _steps(reference)
    assert [line["step"] for line in restarted] == list(range(1, STEPS + 1))  # none missing, none twice
    for got, want in zip(restarted, uninterrupted):
        assert got["loss"] == pytest.approx(want["loss"], rel=2e-5), got["step"]
        assert got["lr"] == pytest.approx(want["lr"], rel=1e-9), got["step"]
    assert (output / "final" / "config.json").is_file()
    fault_log(kind="fault", case=f"kill -9 of rank 1 of 2 at step {KILL_AT_STEP} of {STEPS}, "
                                 "with --max-restarts 2 and --save-every 2",
              exit_code=done.returncode, message=announced[0])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.fault
def test_without_restarts_a_killed_rank_stops_the_job_promptly_naming_the_rank(tmp_path, fault_log):
    output = tmp_path / "run"
    done, elapsed = _train_killing_rank_1(tmp_path, ["--output", str(output)])
    assert done.returncode != 0
    assert elapsed < 240  # a rank left waiting on its dead peer would hang much longer
    last = _trainwise_lines(done.stderr)[-1]
    assert last == "trainwise: error: rank 1 failed (killed by SIGKILL); the job stopped " \
                   "(--resume continues from step 2)"
    assert restarts.checkpoint_step(latest_checkpoint(output)) == 2  # the run is not lost
    fault_log.saved(output / "checkpoints" / "step-00000002")  # the save completed before the kill
    fault_log(kind="fault", case=f"kill -9 of rank 1 of 2 at step {KILL_AT_STEP} of {STEPS}, no --max-restarts",
              exit_code=done.returncode, message=last)


@pytest.mark.fault
@pytest.mark.parametrize("args, expected", [
    (["--nproc", "2"], "trainwise: error: --max-restarts: needs --out DIR: a restarted job continues from "
                       "the checkpoints saved there"),
    (["--output", "DIR"], "trainwise: error: --max-restarts: needs --nproc 2 or more (a single process is "
                          "not restarted; continue it with --resume)"),
], ids=["no output", "one process"])
def test_max_restarts_is_refused_where_there_is_nothing_to_restart(tmp_path, capsys, fault_log, args, expected):
    given = [str(tmp_path / "out") if a == "DIR" else a for a in args]
    code = main(["train", "tiny-llama", "--device", "cpu", "--max-restarts", "1", *given])
    message = capsys.readouterr().err.strip()
    assert code == 2 and message == expected
    assert not (tmp_path / "out").exists()
    fault_log(kind="bad input", case=f"train tiny-llama --max-restarts 1 {' '.join(args)}", exit_code=code,
              message=message)


def test_max_restarts_without_save_every_warns_that_a_restart_starts_over(tmp_path):
    run = RunConfig.from_dict({"max_restarts": 1, "output": str(tmp_path)})
    assert check_restart_request(run, nproc=2) == (
        "trainwise: warning: --max-restarts without --save-every N saves no checkpoint before the end: "
        "a restart starts over from step 0")
    assert check_restart_request(run.replace(save_every=2), nproc=2) is None


def _fake_checkpoint(output, step: int, saved_ns: int):
    path = output / "checkpoints" / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "trainer_state.pt").write_bytes(b"")
    (path / "trainwise.json").write_text(json.dumps({"state": {"step": step}, "saved_ns": saved_ns}))
    return path


def test_a_restart_continues_only_from_a_checkpoint_of_this_job(tmp_path, monkeypatch):
    job_started = time.time_ns()
    _fake_checkpoint(tmp_path, 8, job_started - 1)  # left in a reused --output by an earlier job
    run = RunConfig.from_dict({"max_restarts": 2, "output": str(tmp_path), "save_every": 2})
    monkeypatch.setenv(restarts.RESTART_COUNT, "1")
    monkeypatch.setenv(restarts.JOB_STARTED, str(job_started))
    failure = "E1123 torch/distributed/elastic/multiprocessing/api.py] failed (exitcode: 1) local_rank: 0 (pid: 9)"

    assert run_for_this_attempt(run) == (run, None)
    assert FailureWatcher(run, job_started).see(failure) == ("trainwise: rank 0 failed (exit code 1); restart 1 of 2, "
                                                            "starting over from step 0 (no checkpoint of this job yet)")
    # An explicit --resume began from that checkpoint: a restart goes back to it.
    assert run_for_this_attempt(run.replace(resume=True))[0].resume

    ours = _fake_checkpoint(tmp_path, 2, job_started + 1)
    assert run_for_this_attempt(run) == (run.replace(resume=True), ours)
    assert FailureWatcher(run, job_started).see(failure).endswith("restart 1 of 2, resuming from step 2")
