"""`trainwise.api.benchmark.bench`: a ladder of plans, each run in a fresh process by
trainwise and (the baseline) by the Hugging Face Trainer, measured next to the estimate."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

from trainwise.api.estimate import estimate
from trainwise.bench.capability import skip_reason
from trainwise.bench.chart import save_chart
from trainwise.bench.ladders import Rung, load_ladder
from trainwise.bench.markdown import results_markdown
from trainwise.bench.results import load_results, save_results
from trainwise.bench.rows import empty_row
from trainwise.bench.runner import RowJob, run_row
from trainwise.plan.atomic import atomic_write_text
from trainwise.plan.errors import InputError

BASELINES = ("hf-trainer", "none")
# Sized to the machine: the classic example on a GPU, a small model that finishes quickly on a CPU.
DEFAULT_MODELS = {"cuda": ("bert-large-uncased", {"seq_len": 512}), "cpu": ("tiny-llama", {"seq_len": 128})}
ROW_TIMEOUT_S = 1800


def default_model(device_type: str) -> tuple[str, dict]:
    return DEFAULT_MODELS[device_type]


def bench(model: str | None = None, ladder: str = "default", *, steps: int = 10, out: str | Path = "bench-results",
          baseline: str = "hf-trainer", resume: bool = False, device: str | None = None, task: str | None = None,
          seed: int = 0, base_knobs: dict | None = None,
          on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every rung of `ladder` and return the rows (DESIGN.md's bench row contract).

    Rows are written to `out` (results.json, results.csv, chart.png) after each one."""
    if baseline not in BASELINES:
        raise InputError("--baseline", f"must be one of {', '.join(BASELINES)} (got {baseline!r})")
    if steps < 2:
        raise InputError("--steps", "must be an int >= 2 (one warm-up step is excluded from the timing)")
    device_type = "cuda" if (device or ("cuda" if torch.cuda.is_available() else "cpu")) != "cpu" else "cpu"
    default_name, default_knobs = default_model(device_type)
    base = {"device": device or device_type, **({} if model else default_knobs), **(base_knobs or {})}
    model = model or default_name
    rungs = load_ladder(ladder, base)
    out = Path(out)
    rows = load_results(out) if resume else []
    finished = {(r["name"], r["engine"]) for r in rows if r.get("status") in ("ok", "oom", "skipped")}
    rows = [r for r in rows if (r["name"], r["engine"]) in finished]
    engines = ["trainwise"] + (["hf-trainer"] if baseline == "hf-trainer" else [])
    has_bf16 = device_type != "cuda" or torch.cuda.is_bf16_supported()
    with tempfile.TemporaryDirectory(prefix="trainwise-bench-") as scratch:
        for rung in rungs:
            predicted = None
            for engine in engines:
                if (rung.name, engine) in finished:
                    continue
                reason = skip_reason(rung.plan, device_type, has_bf16)
                if reason:
                    row = empty_row(rung.name, rung.plan.changed_knobs(), engine, "skipped", reason)
                else:
                    predicted = predicted or _predicted(model, rung, task)
                    job = RowJob(rung.name, rung.plan, engine, model, steps, 1, seed, task, Path(scratch), ROW_TIMEOUT_S)
                    row = run_row(job, predicted)
                rows.append(row)
                save_results(out, rows)
                if on_row:
                    on_row(row)
    save_chart(rows, out / "chart.png", f"{model}: {ladder} ladder ({steps} steps per row)")
    command = f"trainwise bench {model} --ladder {ladder} --steps {steps}" + (f" --device {device}" if device else "")
    atomic_write_text(out / "results.md", results_markdown(rows, command, _device_name(device_type)))
    return rows


def _device_name(device_type: str) -> str:
    if device_type == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores)"


def _predicted(model: str, rung: Rung, task: str | None) -> dict | None:
    """The estimate for a rung, used for rows whose run reports no prediction itself."""
    try:
        return estimate(model, rung.plan.replace(compile=False), task=task).memory.to_json()
    except InputError:
        return None
