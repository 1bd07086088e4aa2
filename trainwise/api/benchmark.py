"""`trainwise.api.benchmark.bench`: a ladder of plans, each run in a fresh process by
trainwise and (the baseline) by the Hugging Face Trainer, measured next to the estimate."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

from trainwise.api.compatibility import check_request
from trainwise.api.estimate import estimate
# baseline_ratio also for the bench table's ratio cell (cli/render_bench.py): the command line reaches
# the bench through api/ only.
from trainwise.bench.baseline_ratio import add_baseline_ratios, baseline_ratio
from trainwise.bench.capability import skip_reason
from trainwise.bench.chart import save_chart
from trainwise.bench.ladders import Rung, load_ladder
from trainwise.bench.markdown import results_markdown
from trainwise.bench.repeats import run_repeatedly
from trainwise.bench.results import load_results, save_results
from trainwise.bench.rows import empty_row, row_plan
from trainwise.bench.runner import RowJob, run_row
from trainwise.engine.output_preflight import BENCH_RESULTS_BYTES, check_output_directory
from trainwise.hardware import resolve_device
from trainwise.models import resolve_model
from trainwise.models.quiet import quiet_transformers
from trainwise.common.atomic import atomic_write_text
from trainwise.common.errors import InputError
from trainwise.common.noise import busy_machine
from trainwise.common.progress import Progress, silent
from trainwise.plan.plan import Plan

BASELINES = ("hf-trainer", "none")
# Sized to the machine: the classic example on a GPU, a small model that finishes quickly on a CPU.
DEFAULT_MODELS = {"cuda": ("bert-large-uncased", {"seq_len": 512, "task": "seq-cls"}),  # random tokens
                  "cpu": ("tiny-llama", {"seq_len": 128})}
DEFAULT_LADDERS = {"cuda": "default", "cpu": "quick"}
ROW_TIMEOUT_S = 1800
TIMING_WARMUP_STEPS = 1
MIN_STEPS = TIMING_WARMUP_STEPS + 2  # + the CPU memory-probe step + one timed step
# Runs per row: on a GPU each row is relaunched; on a CPU one run's timed steps give the
# spread, keeping the quick ladder (`make demo`) near 3 minutes on 2 cores.
DEFAULT_REPEAT = {"cuda": 3, "cpu": 1}
# A row finished in an earlier run (kept by --resume); "error" rows are run again.
FINISHED = ("ok", "oom", "skipped")
BENCHING = "bench rows (each a fresh process)"


def bench(model: str | None = None, ladder: str | None = None, *, steps: int = 10,
          out: str | Path = "bench-results", baseline: str = "hf-trainer", resume: bool = False,
          device: str | None = None, task: str | None = None, seed: int = 0, base_knobs: dict | None = None,
          timeout_s: float = ROW_TIMEOUT_S, on_row: Callable[[dict], None] | None = None,
          repeat: int | None = None, progress: Progress = silent) -> list[dict]:
    """Run every rung of `ladder` (a name or a YAML file; default: `default` on a GPU,
    `quick` on a CPU) with trainwise and, unless `baseline` is "none", the HF Trainer, and
    return the rows (the bench row contract of docs/train.md; times in seconds, memory in bytes).

    Each row runs in its own process. results.json and results.csv in `out` are rewritten
    after every row, so an interrupted ladder keeps what finished; chart.png and results.md
    follow at the end. `base_knobs` are set on every rung before the rung's own knobs.

    Each row runs `repeat` times (default 3 on a GPU, 1 on a CPU, where the run's timed
    steps give the spread); the row holds every run, the median rates and their spread
    (bench/repeats.py), and each trainwise row the ratio to the Trainer's only where it
    can be trusted (bench/baseline_ratio.py)."""
    _check_arguments(baseline, steps, repeat, device, out)
    device_type = _device_type(device)
    repeat = repeat or DEFAULT_REPEAT[device_type]
    ladder = ladder or DEFAULT_LADDERS[device_type]
    default_name, default_knobs = DEFAULT_MODELS[device_type]
    if model is None:
        model, task = default_name, task or default_knobs.get("task")
        base_knobs = {"seq_len": default_knobs["seq_len"], **(base_knobs or {})}
    _refuse_up_front(model, task, device or device_type, base_knobs or {})
    rungs = load_ladder(ladder, {"device": device or device_type, **(base_knobs or {})})
    engines = ["trainwise"] + (["hf-trainer"] if baseline == "hf-trainer" else [])
    out = Path(out)
    results = _earlier_rows(out, model, rungs, engines) if resume else {}
    order = [(rung.name, engine) for rung in rungs for engine in engines]
    to_run = [key for key in order if (results.get(key) or {}).get("status") not in FINISHED]
    try:
        with tempfile.TemporaryDirectory(prefix="trainwise-bench-") as scratch:
            for rung in rungs:
                # The rung's estimate: made once, and only if one of its rows runs.
                predicted = functools.cache(lambda plan=rung.plan: _predicted(model, plan, task))
                for engine in engines:
                    earlier = results.get((rung.name, engine))
                    if earlier and earlier["status"] in FINISHED:
                        continue
                    progress(to_run.index((rung.name, engine)), len(to_run), BENCHING)
                    job = RowJob(rung.name, rung.plan, engine, model, steps, TIMING_WARMUP_STEPS, seed, task,
                                 Path(scratch), timeout_s)
                    row = _run(job, predicted, repeat)
                    row["model"] = model
                    results[(rung.name, engine)] = row
                    add_baseline_ratios(_in_order(results, order))
                    save_results(out, _in_order(results, order))
                    if on_row:
                        on_row(row)
            progress(len(to_run), len(to_run), BENCHING)
    finally:
        rows = _in_order(results, order)
        if rows:
            _save_summaries(rows, out, model, ladder, f"--steps {steps} --repeat {repeat}", device,
                            base_knobs or {}, device_type)
    return rows


def _check_arguments(baseline: str, steps: int, repeat: int | None, device: str | None, out) -> None:
    """Bad arguments are refused before the first row, not after it."""
    if baseline not in BASELINES:
        raise InputError("--baseline", f"must be one of {', '.join(BASELINES)} (got {baseline!r})")
    if steps < MIN_STEPS:
        raise InputError("--steps", f"must be an int >= {MIN_STEPS}: the warm-up step and, on a CPU, the "
                                    f"memory-profiled last step are left out of the rates (got {steps})")
    if repeat is not None and (isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1):
        raise InputError("--repeat", f"must be an int >= 1 (got {repeat!r})")
    if device is not None:
        resolve_device(device)  # an unknown GPU name is bad input, not a row to skip
    check_output_directory("--out", out, BENCH_RESULTS_BYTES)


def _run(job: RowJob, predicted: Callable[[], tuple], repeat: int) -> dict:
    """One row: skipped up front when this machine cannot run it, else run `repeat` times,
    each in a fresh process, the machine's load checked before each."""
    reason = _cannot_run_here(job.plan)
    if reason:
        return empty_row(job.name, row_plan(job.plan), job.engine, "skipped", reason)
    estimate_memory, note = predicted()
    on_cpu = _device_type(job.plan.device) == "cpu"
    # A CPU row wants every core; a GPU row about one, to drive the GPU.
    row = run_repeatedly(lambda: run_row(job, estimate_memory), repeat,
                         lambda: busy_machine(job.plan.device, needs_cpus=None if on_cpu else 1))
    if note:
        row["notes"].append(note)
    return row


def _refuse_up_front(model: str, task: str | None, device: str, base_knobs: dict) -> None:
    """What every row would inherit, the model and the knobs given to bench itself, is
    refused as `train` and `estimate` refuse it (exit 2, before any row runs). A rung's own
    knobs that this machine cannot run make skipped rows instead (_cannot_run_here)."""
    spec = resolve_model(model, task=task)
    check_request(Plan.from_dict({"device": device, **base_knobs}), resolve_device(device), spec, here=True)


def _cannot_run_here(plan) -> str | None:
    try:
        check_request(plan, resolve_device(plan.device), here=True)
    except InputError as err:
        return err.message
    return skip_reason(plan, _device_type(plan.device))


def _predicted(model: str, plan, task: str | None) -> tuple[dict | None, str | None]:
    """(the estimate's memory keys for `plan`, a note when there is none). torch.compile
    is predicted as the eager model: compiled graphs usually need less."""
    try:
        with quiet_transformers():
            result = estimate(model, plan.replace(compile=False), task=task)
    except Exception as err:  # noqa: BLE001 - a row without a prediction still measures
        return None, f"no prediction: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
    return result.memory.to_json(), "prediction is for the eager model" if plan.compile else None


def _earlier_rows(out: Path, model: str, rungs: list[Rung], engines: list[str]) -> dict:
    """Rows of an earlier run in `out` for the same model, rung names and plans."""
    plans = {rung.name: row_plan(rung.plan) for rung in rungs}
    return {(row["name"], row["engine"]): row for row in load_results(out)
            if isinstance(row, dict) and row.get("model") == model and row.get("engine") in engines
            and row.get("name") in plans and row.get("plan") == plans[row["name"]]}


def _in_order(results: dict, order: list[tuple[str, str]]) -> list[dict]:
    return [results[key] for key in order if key in results]


def _save_summaries(rows: list[dict], out: Path, model: str, ladder: str, counts: str, device: str | None,
                    base_knobs: dict, device_type: str) -> None:
    save_chart(rows, out / "chart.png", f"{model}: {Path(ladder).stem} ladder ({counts}) "
                                         f"on {_device_name(device_type)}")
    flags = "".join(f" --{k.replace('_', '-')}" + ("" if v is True else f" {v}")
                    for k, v in base_knobs.items() if v is not False)
    command = f"trainwise bench {model} --ladder {ladder} {counts}{flags}" + (
        f" --device {device}" if device else "")
    atomic_write_text(out / "results.md", results_markdown(rows, command, _device_name(device_type)))


def _device_type(device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu" if str(device).lower() == "cpu" else "cuda"


def _device_name(device_type: str) -> str:
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    if device_type == "cuda":
        return "CUDA (none present)"
    return f"CPU ({os.cpu_count()} cores)"
