"""Run one bench row in its own fresh Python process.

Memory is only returned to the device when a process ends, and a crash or an OOM must
not take the ladder down, so each row is a `python -m ...` child. The exit code says
what happened (0 ok, 2 bad input or cannot run here, 3 out of memory, else an error); the
child's metrics file holds the measured summary."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainwise.bench.rows import empty_row, read_summary, row_from_summary, row_plan
from trainwise.plan.plan import Plan

EXIT_BAD_INPUT, EXIT_OOM = 2, 3
# Exit-2 messages that mean "this device or installation cannot" (shown as skipped), as
# opposed to a mistake in the ladder (shown as an error): "fp16 needs a CUDA device",
# "bf16 needs an Ampere or newer GPU", "... needs the bitsandbytes package", "this machine
# has no CUDA GPU", "cuda:1 is not present", "torch.compile is unavailable", "parallel
# layouts are not supported yet".
CAPABILITY_PHRASES = ("needs a ", "needs an ", "needs compute capability", "needs the ", "no CUDA GPU",
                      "is not present", "unavailable", "not supported yet")
# How often a trainwise row reads its steps' values back from the device (`--log-every`).
# Every read waits for the device and leaves it idle while the host queues the next step;
# a training run logs every few steps, not every step, so a row read every step would time
# a slower loop than the one a user runs. Step times stay measured: on a CPU every step is
# timed on its own; on a GPU each window between reads (and the warm-up's end) is timed
# after a device synchronisation and its steps get its mean (engine/pending_steps.py).
LOG_EVERY_STEPS = 10


@dataclass(frozen=True)
class RowJob:
    name: str
    plan: Plan
    engine: str  # "trainwise" or "hf-trainer"
    model: str
    steps: int
    timing_warmup: int
    seed: int
    task: str | None
    workdir: Path
    timeout_s: float


def command(job: RowJob, plan_file: Path, metrics: Path) -> list[str]:
    """The child's command line for `job`."""
    if job.engine == "trainwise":
        argv = [sys.executable, "-m", "trainwise", "train", job.model, "--no-chart",  # timed rows draw nothing
                "--log-every", str(LOG_EVERY_STEPS)]
    else:
        argv = [sys.executable, "-m", "trainwise.bench.hf_trainer_worker", job.model]
    argv += ["--plan", str(plan_file), "--data", "synthetic", "--steps", str(job.steps),
             "--timing-warmup", str(job.timing_warmup), "--metrics", str(metrics), "--seed", str(job.seed)]
    return argv + (["--task", job.task] if job.task else [])


def run_row(job: RowJob, predicted: dict | None = None) -> dict:
    """Run `job` in a fresh process and return its row (status ok/oom/skipped/error)."""
    slug = "".join(c if c.isalnum() else "-" for c in f"{job.engine}-{job.name}").strip("-")
    job.workdir.mkdir(parents=True, exist_ok=True)
    plan_file, metrics = job.workdir / f"{slug}.plan.json", job.workdir / f"{slug}.metrics.jsonl"
    plan_file.write_text(json.dumps(job.plan.to_dict()))
    metrics.unlink(missing_ok=True)
    plan = row_plan(job.plan)
    try:
        done = subprocess.run(command(job, plan_file, metrics), capture_output=True, text=True,
                              timeout=job.timeout_s)
    except subprocess.TimeoutExpired:
        return empty_row(job.name, plan, job.engine, "error", f"timed out after {job.timeout_s:.0f} s")
    message = _last_error_line(done.stderr)
    if done.returncode == EXIT_OOM:
        return empty_row(job.name, plan, job.engine, "oom", message)
    if done.returncode == EXIT_BAD_INPUT:
        status = "skipped" if any(phrase in message for phrase in CAPABILITY_PHRASES) else "error"
        return empty_row(job.name, plan, job.engine, status, message)
    summary = read_summary(metrics)
    if done.returncode != 0 or summary is None:
        return empty_row(job.name, plan, job.engine, "error", message or f"exit code {done.returncode}")
    # The parent's estimate first, so both engines' rows of a rung carry the same prediction.
    return row_from_summary(job.name, plan, job.engine, summary, predicted or summary.get("predicted"))


def _last_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("trainwise: error:"):
            return line[len("trainwise: error:"):].strip()
    return lines[-1] if lines else ""
