"""Asynchronous distributed checkpoints (`--checkpoint-async`): training goes on while a save
is written, at most one save is in flight, the manifest is written only once the shards are
all on disk, and a whole job killed (SIGKILL) with a save in flight resumes from the last
complete checkpoint with the losses of an unbroken run.

The slow writes are injected from outside trainwise, as in test_rank_failure.py: a
sitecustomize.py on the workers' PYTHONPATH, active only when TRAINWISE_TEST_SLOW_SAVES
names a folder, wraps DCP's file writer (it runs in the background writer's thread). Its
first write waits 2 s before writing, so the training steps after it change the weights
while it is in flight (an unstaged save would write them changed); its second marks
the folder and then waits 10 minutes, so that save is in flight when the job is killed.
With TRAINWISE_TEST_SLOW_SAVES_ONCE set, only the first write waits (3 s, marking the
folder first) and the later ones write at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from distributed_launch import REPO
from job_processes import kill_job
from trainwise.cli.main import main
from trainwise.engine.checkpoint import latest_checkpoint
from trainwise.engine.checkpoint_manifest import verify_manifest

STEPS = 6  # saves after steps 2 and 4 (asynchronous), the last after step 6 (synchronous)
RUN = ["train", "tiny-llama", "--nproc", "2", "--device", "cpu", "--data", "synthetic", "--batch-size", "1",
       "--seq-len", "16", "--lr", "1e-3", "--warmup-steps", "2", "--steps", str(STEPS), "--log-every", "1",
       "--save-every", "2", "--checkpoint-async"]

SITECUSTOMIZE = '''
import os

if os.environ.get("TRAINWISE_TEST_SLOW_SAVES") and os.environ.get("RANK") is not None:
    import pathlib
    import time

    from torch.distributed.checkpoint import filesystem

    _original, _calls = filesystem._FileSystemWriter.write_data, [0]

    def write_data(self, *args, **kwargs):
        _calls[0] += 1
        folder = pathlib.Path(os.environ["TRAINWISE_TEST_SLOW_SAVES"])
        if os.environ.get("TRAINWISE_TEST_SLOW_SAVES_ONCE"):
            if _calls[0] == 1:
                (folder / ("in-flight-" + os.environ["RANK"])).write_text("")
                time.sleep(3)
        elif _calls[0] == 1:
            time.sleep(2)
        else:
            (folder / ("in-flight-" + os.environ["RANK"])).write_text("")
            time.sleep(600)
        return _original(self, *args, **kwargs)

    filesystem._FileSystemWriter.write_data = write_data
'''


def _steps(metrics) -> list[dict]:
    return [line for line in map(json.loads, metrics.read_text().splitlines()) if "step" in line]


def _start_with_slow_saves(tmp_path, args: list[str], **env_extra):
    """The job (`trainwise train` plus `args`) in a session of its own, its ranks' saves slowed
    by the sitecustomize above; (the process, the folder the hook marks)."""
    hooks, marks = tmp_path / "hooks", tmp_path / "marks"
    hooks.mkdir()
    marks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{hooks}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "TRAINWISE_TEST_SLOW_SAVES": str(marks), **env_extra}
    job = subprocess.Popen([sys.executable, "-m", "trainwise", *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    return job, marks


def _killed_with_a_save_in_flight(tmp_path, output, metrics) -> tuple[int, list[dict]]:
    """Run the job with slow saves; SIGKILL the whole job (launcher, torchrun, both ranks:
    each in a session of its own) once the second save is in flight on both ranks and step
    6 is logged. Returns the exit status and the step lines logged before the kill."""
    job, marks = _start_with_slow_saves(tmp_path, [*RUN, "--output", str(output), "--metrics", str(metrics)])
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and job.poll() is None:
            both_in_flight = len(list(marks.glob("in-flight-*"))) == 2
            if both_in_flight and metrics.is_file() and len(_steps(metrics)) == STEPS:
                break
            time.sleep(0.05)
        logged = _steps(metrics) if metrics.is_file() else []
        assert job.poll() is None, job.communicate()[1][-3000:]
    finally:
        kill_job(job.pid)
        job.communicate()
    return job.returncode, logged


@pytest.mark.fault
def test_checkpoint_async_is_refused_for_one_process(tmp_path, capsys, fault_log):
    code = main(["train", "tiny-llama", "--device", "cpu", "--steps", "2", "--checkpoint-async",
                 "--output", str(tmp_path / "out")])
    message = capsys.readouterr().err.strip()
    assert code == 2
    assert message == ("trainwise: error: --checkpoint-async: needs --nproc 2 or more (asynchronous saves write "
                       "distributed checkpoints; a one-process run saves synchronously)")
    assert not (tmp_path / "out").exists()
    fault_log(kind="bad input", case="train tiny-llama --checkpoint-async --output DIR (one process)",
              exit_code=code, message=message)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.fault
def test_a_job_killed_during_an_async_save_resumes_from_the_last_complete_checkpoint_with_the_same_losses(
        tmp_path, monkeypatch, fault_log):
    """Two gloo ranks, 2 launches (about a minute of CPU). The killed run had logged all 6
    steps before it was killed, so its losses are an unbroken run's."""
    output, metrics = tmp_path / "run", tmp_path / "metrics.jsonl"
    output.mkdir()
    (output / "notes.txt").write_text("the user's own file\n")
    fault_log.watch(output / "notes.txt")
    code, unbroken = _killed_with_a_save_in_flight(tmp_path, output, metrics)

    assert code == -signal.SIGKILL
    # Training went on to step 6 while step 4's save was in flight; step 2's was completed
    # (manifest last) before step 4's began: at most one in flight.
    assert [line["step"] for line in unbroken] == list(range(1, STEPS + 1))
    checkpoints = output / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == ["latest", "step-00000002"]
    assert latest_checkpoint(output) == checkpoints / "step-00000002"
    verify_manifest(checkpoints / "step-00000002")
    in_flight = [p for p in checkpoints.glob(".step-00000004.*")]
    assert len(in_flight) == 1 and not (in_flight[0] / "manifest.json").exists()

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as in the killed launch
    assert main([*RUN, "--output", str(output), "--metrics", str(metrics), "--resume"]) == 0
    resumed = _steps(metrics)
    assert [line["step"] for line in resumed] == list(range(1, STEPS + 1))  # none missing, none twice
    for got, want in zip(resumed, unbroken):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), got["step"]
        assert got["lr"] == pytest.approx(want["lr"], rel=1e-9), got["step"]
    verify_manifest(checkpoints / "step-00000006")
    # Throughput is the job's (both ranks' samples), per GPU the job's over the 2 processes.
    summary = json.loads(metrics.read_text().splitlines()[-1])["summary"]
    assert summary["gpus"] == 2
    assert summary["tokens_per_s_per_gpu"] == pytest.approx(summary["tokens_per_s"] / 2)
    assert summary["samples_per_s"] == pytest.approx(2 / summary["step_time_s"])
    for line in resumed:
        if line["tokens_per_s"] is not None:
            assert line["tokens_per_s_per_gpu"] == pytest.approx(line["tokens_per_s"] / 2)
    assert (output / "final" / "config.json").is_file()
    fault_log(kind="fault", case=f"kill -9 of the whole `trainwise train --nproc 2 --checkpoint-async` job (gloo) "
                                 f"while the save of step 4 of {STEPS} is in flight, then --resume",
              exit_code=code, message="resumed from step-00000002 (the last complete checkpoint); steps 3-6 "
                                      "repeated with the unbroken run's losses")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.fault
def test_a_stop_signal_during_an_async_save_completes_it_before_saving_where_it_stopped(tmp_path, fault_log):
    """SIGTERM to the launcher while the first save (step 2) is held in flight for 3 s: the
    job stops with exit 143, and before it ends the save in flight and the stop's own save
    are complete (each with its manifest, `latest` the stop's, no temporary directory left)."""
    output, metrics, steps = tmp_path / "run", tmp_path / "metrics.jsonl", 40
    args = [*RUN[:RUN.index("--steps") + 1], str(steps), *RUN[RUN.index("--steps") + 2:]]
    job, marks = _start_with_slow_saves(tmp_path, [*args, "--output", str(output), "--metrics", str(metrics)],
                                        TRAINWISE_TEST_SLOW_SAVES_ONCE="1")
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and job.poll() is None:
            if len(list(marks.glob("in-flight-*"))) == 2:
                job.send_signal(signal.SIGTERM)
                break
            time.sleep(0.02)
        stderr = job.communicate(timeout=240)[1]
    finally:
        if job.poll() is None:
            kill_job(job.pid)
    assert job.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    stopped_after = len(_steps(metrics))
    assert 2 <= stopped_after < steps
    checkpoints = output / "checkpoints"
    saved = sorted(p.name for p in checkpoints.glob("step-*"))
    assert saved[-1] == f"step-{stopped_after:08d}"
    for name in saved:
        verify_manifest(checkpoints / name)
        fault_log.saved(checkpoints / name)
    assert latest_checkpoint(output) == checkpoints / f"step-{stopped_after:08d}"
    assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".step-")]  # none left in flight
    line = next(line for line in stderr.splitlines() if line.startswith("trainwise: stopped by SIGTERM"))
    fault_log(kind="fault", case="SIGTERM to `trainwise train --nproc 2 --checkpoint-async --save-every 2` (gloo) "
                                 "while the save of step 2 is in flight",
              exit_code=job.returncode, message=line.replace(str(output), "OUT"))
