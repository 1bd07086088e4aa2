"""Verify: run the top plans of a search for a few steps each, on the device present, and
set what was measured next to what was predicted.

Each run is a fresh process (the bench runner, trainwise/bench/runner.py): a plan that
runs out of memory or cannot run here is reported and the next one runs. A plan is run
`repeat` times; its measured step time is the median of the runs and its spread
(max - min) / median, in the same terms as the bench. The recommendation (the measured
best, and whether it is distinguishable from the runner-up) is trainwise/search/verdict.py;
what is written back into the device profile is trainwise/search/corrections.py."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from trainwise.bench import runner
from trainwise.bench.runner import RowJob
from trainwise.common.errors import InputError
from trainwise.common.noise import busy_machine
from trainwise.common.progress import Progress, silent
from trainwise.hardware.detect import catalog_gpu_present
from trainwise.hardware.device import Device
from trainwise.search.candidate import Candidate
from trainwise.search.corrections import record_corrections
from trainwise.search.verdict import decide, samples_per_step

# A run that takes longer than this is reported as an error (a hung child must not hang
# the plan command). Verify runs a few steps, so this is far above a healthy run.
RUN_TIMEOUT_S = 900.0
SEED = 0
VERIFYING = "verification runs"


@dataclass(frozen=True)
class VerifiedCandidate:
    """One candidate as predicted and as measured.

    Seconds per optimizer step, tokens per second the whole job's (over all ranks; per GPU:
    over the plan's GPUs), bytes. `measured_runs_s`
    holds each run's mean step time over its timed steps (warm-up and, on the CPU, the
    memory-probe step excluded); `measured_step_s` is their median and `spread` their
    (max - min) / median (None with fewer than two runs). `memory_kind` names the measured
    figure set against the predicted device total: "device total" on a GPU, "peak
    allocated" on the CPU (which has no allocator cache or context, so the two agree)."""

    rank: int  # the search's rank, 1 = predicted best
    candidate: Candidate
    status: str  # "ok", "oom", "skipped" or "error"
    message: str = ""
    measured_runs_s: tuple[float, ...] = ()
    measured_tokens_per_s: float | None = None
    measured_memory_bytes: int | None = None
    memory_kind: str | None = None

    @property
    def predicted_step_s(self) -> float:
        return self.candidate.step_s

    @property
    def predicted_memory_bytes(self) -> int:
        return self.candidate.memory_bytes

    @property
    def measured_tokens_per_s_per_gpu(self) -> float | None:
        return None if self.measured_tokens_per_s is None else self.measured_tokens_per_s / self.candidate.gpus

    @property
    def measured_step_s(self) -> float | None:
        return statistics.median(self.measured_runs_s) if self.measured_runs_s else None

    @property
    def spread(self) -> float | None:
        runs = self.measured_runs_s
        if len(runs) < 2:
            return None
        return (max(runs) - min(runs)) / statistics.median(runs)

    @property
    def step_ratio(self) -> float | None:
        """Measured / predicted step time (> 1: slower than predicted)."""
        if self.measured_step_s is None or not self.predicted_step_s or self.predicted_step_s <= 0:
            return None
        return self.measured_step_s / self.predicted_step_s

    @property
    def memory_ratio(self) -> float | None:
        """Measured / predicted peak memory."""
        if self.measured_memory_bytes is None or not self.predicted_memory_bytes:
            return None
        return self.measured_memory_bytes / self.predicted_memory_bytes


@dataclass(frozen=True)
class VerifyReport:
    """Every verified candidate in the search's order, the verdict, and what was written.

    recommended / predicted_best: indexes into `entries` (None when nothing ran).
    confident: False when the measured best cannot be told from the runner-up (see
    verdict.py) or the machine was busy. `lines`: the verdict in words, for the table's
    foot. `corrections`: the correction keys written into the profile and their new
    values; `profile_written`: that file, or None with `corrections_note` saying why not."""

    model: str
    device_name: str
    steps: int
    timing_warmup: int
    repeat: int
    entries: tuple[VerifiedCandidate, ...]
    recommended: int | None = None
    predicted_best: int | None = None
    confident: bool = False
    lines: tuple[str, ...] = ()
    busy: str | None = None
    corrections: dict[str, float] = field(default_factory=dict)
    profile_written: Path | None = None
    corrections_note: str = ""

    @property
    def recommended_candidate(self) -> Candidate | None:
        return None if self.recommended is None else self.entries[self.recommended].candidate


def verify_candidates(model: str, candidates: list[Candidate], *, steps: int, timing_warmup: int, repeat: int,
                      workdir: Path, task: str | None, profile_path: Path | None, device: Device,
                      progress: Progress = silent) -> VerifyReport:
    """Run each candidate `repeat` times for `steps` optimizer steps (the first
    `timing_warmup` untimed) in fresh processes on `device`, which must be this machine's;
    decide the measured best; write the measured/predicted step-time ratios into the
    device profile (`profile_path`, else the per-user cache for `device`)."""
    check_verify_request(candidates, steps=steps, timing_warmup=timing_warmup, repeat=repeat, device=device)
    busy = _busy_machine(device.kind)  # before the runs: the runs themselves load the CPU
    runs = _RunCounter(progress, len(candidates) * repeat)
    entries = tuple(_verify_one(model, rank, candidate, steps=steps, timing_warmup=timing_warmup, repeat=repeat,
                                workdir=Path(workdir), task=task, runs=runs)
                    for rank, candidate in enumerate(candidates, 1))
    progress(runs.total, runs.total, VERIFYING)
    report = VerifyReport(model=model, device_name=device.name, steps=steps, timing_warmup=timing_warmup,
                          repeat=repeat, entries=entries, busy=busy)
    report = decide(report)
    return record_corrections(report, model, device, profile_path)


def check_verify_request(candidates: list[Candidate], *, steps: int, timing_warmup: int, repeat: int,
                         device: Device) -> None:
    """Refuse, before any run, what cannot give a measured step time on this machine."""
    if not candidates:
        raise InputError("--verify", "there is no plan to verify (the search kept none)")
    if repeat < 1:
        raise InputError("--verify-repeat", f"{repeat}: allowed is 1 or more runs per plan")
    if timing_warmup < 0:
        raise InputError("--verify-steps", f"timing warm-up {timing_warmup}: allowed is 0 or more steps")
    # The CPU's memory-probe step runs under the profiler and is left out of the timing too.
    needed = timing_warmup + (2 if device.kind == "cpu" else 1)
    if steps < needed:
        raise InputError("--verify-steps", f"{steps}: at least {needed} on {device.name} "
                                           f"({timing_warmup} warm-up step(s), then one timed step"
                                           + (", then the memory-probe step)" if device.kind == "cpu" else ")"))
    check_device_present(device)


def check_device_present(device: Device) -> None:
    """Verify runs the plans here: refuse a target GPU this machine does not have (called
    before the search too, so the refusal comes before any long work)."""
    if device.kind == "cuda" and not _present(device):
        raise InputError("--verify", f"runs the plans on this machine, and {device.name} is not present here; "
                                     "verify on the machine the plan is for")


def _present(device: Device) -> bool:
    """A detected GPU, or a catalog GPU of which this machine has one (the engine trains a
    catalog-named plan on the GPU present)."""
    if device.source == "detected":
        return True
    return device.source == "catalog" and catalog_gpu_present(device.name)


class _RunCounter:
    """Counts the verification runs started, for the progress report."""

    def __init__(self, progress: Progress, total: int):
        self.progress, self.total, self.started = progress, total, 0

    def next(self) -> None:
        self.progress(self.started, self.total, VERIFYING)
        self.started += 1


def _verify_one(model: str, rank: int, candidate: Candidate, *, steps: int, timing_warmup: int, repeat: int,
                workdir: Path, task: str | None, runs: _RunCounter) -> VerifiedCandidate:
    """Run one candidate `repeat` times; the first run that does not end ok ends it."""
    per_step = samples_per_step(candidate)
    counter, runs, tokens, memory = runs, [], [], []
    for attempt in range(1, repeat + 1):
        counter.next()
        job = RowJob(name=f"verify-{rank}-run-{attempt}", plan=candidate.plan, engine="trainwise", model=model,
                     steps=steps, timing_warmup=timing_warmup, seed=SEED, task=task, workdir=workdir,
                     timeout_s=RUN_TIMEOUT_S)
        row = runner.run_row(job)
        if row["status"] != "ok":
            return VerifiedCandidate(rank, candidate, row["status"], _run_message(row, attempt, repeat))
        if not row.get("samples_per_s"):
            return VerifiedCandidate(rank, candidate, "error", "the run reported no step rate")
        runs.append(per_step / row["samples_per_s"])
        tokens.append(row.get("tokens_per_s"))
        memory.append(_measured_memory(row["measured"]))
    kinds = {kind for _, kind in memory}
    peaks = [value for value, _ in memory if value is not None]
    return VerifiedCandidate(rank, candidate, "ok", measured_runs_s=tuple(runs),
                             measured_tokens_per_s=statistics.median(t for t in tokens if t is not None)
                             if any(t is not None for t in tokens) else None,
                             measured_memory_bytes=max(peaks) if peaks else None,
                             memory_kind=kinds.pop() if len(kinds) == 1 else None)


def _measured_memory(measured: dict) -> tuple[int | None, str | None]:
    """The measured figure comparable with the predicted device total, and its name."""
    if measured.get("device_total") is not None:
        return measured["device_total"], "device total"
    if measured.get("peak_allocated") is not None:
        return measured["peak_allocated"], "peak allocated"
    return None, None


def _run_message(row: dict, attempt: int, repeat: int) -> str:
    reason = row.get("reason") or row["status"]
    return reason if attempt == 1 else f"run {attempt} of {repeat}: {reason} (earlier runs were ok)"


def _busy_machine(device_kind: str) -> str | None:
    """Why timings taken now would be disturbed, or None (trainwise/common/noise.py)."""
    return busy_machine(device_kind)


def report_to_json(report: VerifyReport) -> dict:
    """The report for `--json`: seconds, bytes, ratios; indexes become the search's ranks."""
    def rank_of(index):
        return None if index is None else report.entries[index].rank

    return {"model": report.model, "device": report.device_name, "steps": report.steps,
            "timing_warmup": report.timing_warmup, "repeat": report.repeat,
            "recommended_rank": rank_of(report.recommended), "predicted_best_rank": rank_of(report.predicted_best),
            "confident": report.confident, "verdict": list(report.lines), "busy": report.busy,
            "corrections": dict(report.corrections),
            "profile_written": str(report.profile_written) if report.profile_written else None,
            "plans": [{"rank": e.rank, "plan": e.candidate.plan.changed_knobs(), "status": e.status,
                       "message": e.message, "predicted_step_s": e.predicted_step_s,
                       "measured_step_s": e.measured_step_s, "measured_runs_s": list(e.measured_runs_s),
                       "spread": e.spread, "step_ratio": e.step_ratio,
                       "predicted_memory_bytes": e.predicted_memory_bytes,
                       "measured_memory_bytes": e.measured_memory_bytes, "measured_memory_kind": e.memory_kind,
                       "predicted_tokens_per_s": _finite(e.candidate.tokens_per_s),
                       "predicted_tokens_per_s_per_gpu": _finite(e.candidate.tokens_per_s_per_gpu),
                       "measured_tokens_per_s": e.measured_tokens_per_s,
                       "measured_tokens_per_s_per_gpu": e.measured_tokens_per_s_per_gpu} for e in report.entries]}


def _finite(value: float) -> float | None:
    """A predicted rate for JSON: None where there was no time prediction (NaN)."""
    return None if math.isnan(value) else value
