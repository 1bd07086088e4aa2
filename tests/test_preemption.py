"""Preemption: SIGTERM, SIGINT and SIGUSR1 end a training run after its current step with a
checkpoint, one line and exit 128 + the signal's number; `--resume` then continues the
uninterrupted run's loss curve step for step."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from job_processes import alive, descendants
from metrics_file import step_losses as _losses
from trainwise.api.training import train
from trainwise.cli.main import main
from trainwise.engine.checkpoint_manifest import verify_manifest
from trainwise.engine.preemption import Preempted
from trainwise.engine.run_config import RunConfig
from trainwise.plan import Plan

STEPS = 8
NPROC_STEPS = 40
# No --save-every: the only checkpoint is the one the signal makes.
RUN = ["train", "tiny-llama", "--data", "synthetic", "--device", "cpu", "--seq-len", "16", "--batch-size", "1",
       "--steps", str(STEPS), "--deterministic"]


@pytest.fixture(scope="module")
def uninterrupted_losses(tmp_path_factory):
    metrics = tmp_path_factory.mktemp("uninterrupted") / "metrics.jsonl"
    assert main([*RUN, "--metrics", str(metrics)]) == 0
    return _losses(metrics)


def _signal_after_first_step(tmp_path, signum) -> tuple[subprocess.Popen, str]:
    """Start the run in a child process, send it `signum` once the metrics file shows a
    step, and return the process (ended) and its stderr."""
    metrics = tmp_path / "metrics.jsonl"
    child = subprocess.Popen([sys.executable, "-m", "trainwise", *RUN, "--output", str(tmp_path / "out"),
                              "--metrics", str(metrics)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and child.poll() is None:
        if metrics.is_file() and '"step"' in metrics.read_text():
            child.send_signal(signum)
            break
        time.sleep(0.01)
    _, stderr = child.communicate(timeout=180)
    return child, stderr.decode()


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name)
def test_a_stop_signal_saves_after_the_current_step_and_resume_continues_the_same_loss_curve(
        tmp_path, signum, uninterrupted_losses, fault_log):
    child, stderr = _signal_after_first_step(tmp_path, signum)

    last = stderr.strip().splitlines()[-1]
    assert child.returncode == 128 + signum, stderr[-2000:]
    stopped_after = len(_losses(tmp_path / "metrics.jsonl"))
    assert 1 <= stopped_after < STEPS
    checkpoint = tmp_path / "out" / "checkpoints" / f"step-{stopped_after:08d}"
    assert last == (f"trainwise: stopped by {signum.name} after step {stopped_after} of {STEPS}; "
                    f"checkpoint saved in {checkpoint}; continue with --resume")
    assert (checkpoint / "manifest.json").is_file()
    summary = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["summary"]
    assert summary["stopped_by_signal"] == signum
    fault_log.watch(checkpoint)

    assert main([*RUN, "--output", str(tmp_path / "out"), "--metrics", str(tmp_path / "metrics.jsonl"),
                 "--resume"]) == 0
    assert _losses(tmp_path / "metrics.jsonl") == pytest.approx(uninterrupted_losses, rel=1e-6, abs=1e-7)
    fault_log(kind="fault", case=f"{signum.name} to `trainwise train --output DIR` during training, then --resume",
              exit_code=child.returncode, message=last.replace(str(tmp_path / "out"), "OUT"))


@pytest.mark.fault
def test_a_stop_signal_without_output_says_that_nothing_could_be_saved(fault_log):
    def signal_at_step_two(entry):
        if entry.step == 2:
            signal.raise_signal(signal.SIGUSR1)

    def unhandled(signum, frame):  # what the test process does with the signal outside the run
        raise AssertionError("the run let SIGUSR1 through")

    before = signal.signal(signal.SIGUSR1, unhandled)

    try:
        with pytest.raises(Preempted) as stopped:
            train("tiny-llama", plan=Plan(device="cpu", batch_size=1, seq_len=16),
                  run=RunConfig(steps=5, data="synthetic"), on_step=signal_at_step_two)
        assert signal.getsignal(signal.SIGUSR1) is unhandled  # the run's handlers are gone with it
    finally:
        signal.signal(signal.SIGUSR1, before)

    assert stopped.value.exit_code == 128 + signal.SIGUSR1
    assert str(stopped.value) == ("stopped by SIGUSR1 after step 2 of 5; nothing could be saved (no --out): "
                                  "rerun with --out DIR to keep progress")
    fault_log(kind="fault", case="SIGUSR1 during a run without --output", exit_code=stopped.value.exit_code,
              message=f"trainwise: {stopped.value}")


_TWO_SIGNALS = textwrap.dedent("""
    import os, signal, time
    from trainwise.engine.preemption import StopSignals
    with StopSignals() as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.requested() == signal.SIGTERM
        print("first one noted", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
""")


@pytest.mark.fault
def test_a_second_signal_of_the_same_kind_stops_at_once(fault_log):
    started = time.monotonic()
    child = subprocess.run([sys.executable, "-c", _TWO_SIGNALS], capture_output=True, text=True, timeout=60)
    assert child.stdout == "first one noted\n", child.stderr
    assert child.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 20
    fault_log(kind="fault", case="a second SIGTERM while the first one's checkpoint is pending",
              exit_code=128 + signal.SIGTERM, message="(ended by the signal at once, as its default action)")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.fault
def test_sigterm_to_an_nproc_job_stops_every_rank_at_one_step_with_one_checkpoint(tmp_path, monkeypatch, fault_log):
    """Two gloo ranks: the launcher relays the signal, the ranks agree on the step, save one
    distributed checkpoint and resume from it to the end (2 launches; about 50 s of CPU).
    The signalled launcher is a process of its own; the resume is the same command through
    main() here (torchrun and two fresh workers all the same), less a Python start-up."""
    metrics, out = tmp_path / "metrics.jsonl", tmp_path / "out"
    # More steps than the one-process cases: the signal travels launcher -> torchrun -> ranks,
    # and on a loaded machine 8 millisecond steps could all finish before it arrives.
    steps = NPROC_STEPS
    argv = [sys.executable, "-m", "trainwise", *RUN[:-2], str(steps), RUN[-1], "--nproc", "2",
            "--output", str(out), "--metrics", str(metrics)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and child.poll() is None:
        if metrics.is_file() and '"step"' in metrics.read_text():
            child.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    stderr = child.communicate(timeout=240)[1]

    assert child.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    stopped_after = len(_losses(metrics))
    assert 1 <= stopped_after < steps
    checkpoint = out / "checkpoints" / f"step-{stopped_after:08d}"
    line = (f"trainwise: stopped by SIGTERM after step {stopped_after} of {steps}; "
            f"checkpoint saved in {checkpoint}; continue with --resume")
    assert stderr.splitlines().count(line) == 1  # rank 0 speaks for the job
    assert sorted(p.name for p in (checkpoint / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    verify_manifest(checkpoint)
    assert json.loads((checkpoint / "trainwise.json").read_text())["state"]["step"] == stopped_after
    fault_log.watch(checkpoint)

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' as in the first launch
    assert main([*argv[3:], "--resume"]) == 0  # the job's stderr: pytest's report
    assert [line["step"] for line in map(json.loads, metrics.read_text().splitlines()) if "step" in line] == \
        list(range(1, steps + 1))
    fault_log(kind="fault", case="SIGTERM to `trainwise train --nproc 2 --output DIR` (gloo), then --resume",
              exit_code=child.returncode, message=line.replace(str(out), "OUT"))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.fault
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent's death signal is Linux's")
def test_a_launcher_killed_outright_leaves_no_rank_training_and_the_ranks_save_where_they_stopped(tmp_path, fault_log):
    """SIGKILL to `trainwise train --nproc 2` alone (as the OOM killer or `kill -9` sends it):
    no signal can be relayed, yet torchrun and both ranks end within a minute, and the ranks
    save after the step they were in, as on SIGTERM. Before, they trained on as orphans."""
    metrics, out = tmp_path / "metrics.jsonl", tmp_path / "out"
    argv = [sys.executable, "-m", "trainwise", *RUN[:-2], str(NPROC_STEPS * 5), RUN[-1], "--nproc", "2",
            "--output", str(out), "--metrics", str(metrics)]
    child = subprocess.Popen(argv, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    job: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None:
            if metrics.is_file() and '"step"' in metrics.read_text():
                job = descendants(child.pid)
                child.kill()
                break
            time.sleep(0.01)
        child.wait(timeout=60)
        assert len(job) >= 3, job  # torchrun and two ranks
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and any(map(alive, job)):
            time.sleep(0.1)
        left = [pid for pid in job if alive(pid)]
        assert not left, f"still running after the launcher was killed: {left}"
    finally:
        for pid in job + descendants(child.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert saved, "the ranks stopped without saving"
    verify_manifest(saved[-1])
    assert len(_losses(metrics)) < NPROC_STEPS * 5
    fault_log(kind="fault", case="SIGKILL to the launcher of `trainwise train --nproc 2 --output DIR` (gloo) alone",
              exit_code=child.returncode, message=f"torchrun and both ranks ended; the ranks saved {saved[-1].name}")
