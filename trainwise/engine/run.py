"""The training run: steps, logging, evaluation, checkpoints and the final summary.

One optimizer step is `train_step.training_step`; this file drives it: resume from the
latest good checkpoint, feed micro-batches from the data position, measure time and
memory, write the metrics file, save and export atomically. Steps' values stay on the
device until a read point (a logged, evaluated or saved step, the last one, a stop:
engine/pending_steps.py), so the steps between them never wait for the device. A stop
signal (engine/preemption.py) ends the run after the current step with a checkpoint."""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.distributed.tensor import DTensor

from trainwise.engine.checkpoint import (CHECKPOINTS, TrainingState, latest_checkpoint, restore_checkpoint,
                                         resumable_checkpoint)
from trainwise.engine.checkpoint_saves import CheckpointSaves, check_async_request
from trainwise.engine.compile_cache import compile_cache_dir, compile_events
from trainwise.engine.evaluate import evaluate
from trainwise.engine.export import export_final
from trainwise.engine.memory_probe import MemoryProbe
from trainwise.engine.metrics import MetricsLog, StepTimer
from trainwise.engine.reports import open_reports
from trainwise.engine.preemption import Preempted, StopSignals
from trainwise.engine.run_config import RunConfig
from trainwise.engine.pending_steps import PendingSteps
from trainwise.engine.step_accounts import StepAccounts
from trainwise.engine.setup import TrainingSetup
from trainwise.engine.step_values import StepValues
from trainwise.engine.train_step import training_step
from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan
from trainwise.techniques.fused_loss_model import loss_implementation


@dataclass(frozen=True)
class StepLog:
    """What the progress display gets after each step. The loop reads the device only at
    read points (a logged, evaluated or saved step, the last one, a stop): elsewhere
    `outcome` and `peak_allocated` are None, and so are the times and rates until the
    step's timing window has closed (every step on a CPU; on a GPU at read points and at
    the end of the warm-up, each step getting its window's mean: measured)."""

    step: int  # steps completed
    total_steps: int
    outcome: StepValues | None
    step_time_s: float | None
    samples_per_s: float | None  # the whole job's
    tokens_per_s: float | None
    mfu: float | None
    peak_allocated: int | None
    eval_loss: float | None = None
    samples_per_s_per_gpu: float | None = None  # the job's over its processes
    tokens_per_s_per_gpu: float | None = None
    # CPU seconds this process spent in the step, all its threads together: on a shared
    # machine, with one thread, the step's time when it has a core to itself.
    step_cpu_s: float | None = None
    compiled: bool = False  # torch.compile compiled (or loaded from its cache) during the step


@dataclass
class RunOutcome:
    steps_done: int
    started_at_step: int
    final_loss: float | None
    summary: dict
    checkpoint: Path | None = None
    exports: dict = field(default_factory=dict)
    eval_loss: float | None = None


class _CountingIterator:
    """Counts micro-batches taken, which is the data position a checkpoint records."""

    def __init__(self, iterator: Iterator, start: int):
        self._iterator, self.consumed = iterator, start

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._iterator)
        self.consumed += 1
        return item


def run_training(setup: TrainingSetup, data, plan: Plan, run: RunConfig, *, flops_per_step: int | None,
                 peak_flops: float | None, on_step: Callable[[StepLog], None] | None = None) -> RunOutcome:
    """Train for `run.steps` optimizer steps (continuing a checkpoint under `run.resume`).

    `data` is a TrainData (trainwise.engine.data); `flops_per_step` the counted model FLOPs
    of one optimizer step (None: no MFU); `peak_flops` the device's peak FLOP/s for the
    plan's dtype (None on a CPU). Raises Preempted after saving when a stop signal came,
    WriteFailed when a checkpoint could not be written."""
    with StopSignals(distributed=setup.has_mesh, device=setup.device) as stops:
        return _run(setup, data, plan, run, flops_per_step, peak_flops, on_step, stops)


def _run(setup: TrainingSetup, data, plan: Plan, run: RunConfig, flops_per_step: int | None,
         peak_flops: float | None, on_step: Callable[[StepLog], None] | None, stops: StopSignals) -> RunOutcome:
    check_async_request(run, setup.has_mesh)
    state = _resume_state(setup, run, plan)
    started = state.step
    batches = _CountingIterator(iter(data.micro_batches(start=state.micro_batches_consumed)),
                                state.micro_batches_consumed)
    eval_batches = data.eval_batches(run.eval_batches) if run.eval_every else []
    warmup = run.timing_warmup if run.timing_warmup is not None else default_timing_warmup(plan)
    probe_step = run.steps - 1  # CPU memory is profiled on the last step (it runs slower)
    probe = MemoryProbe(setup.device, probe_step=probe_step)
    timer = _step_timer(setup, data, plan, flops_per_step, peak_flops)
    log = _metrics_log(run, plan, started)
    probe.reset()
    accounts = StepAccounts(state, timer, first_timed=started + warmup,
                            untimed={probe_step} if setup.device.type == "cpu" else set())
    pending, eval_loss, checkpoint, stop_signal = PendingSteps(setup.device), None, None, None
    saves = CheckpointSaves(run, setup, plan)
    run_started = time.perf_counter()
    for step in range(started, run.steps):
        probe.step_begin(step, _live_tensors(setup))
        outcome, compiled = _one_step(setup, batches, plan, run)
        pending.add(step, outcome)
        read_now = _is_read_point(step, run)
        accounts.note_compiled(step, compiled)
        # End to end: a step's time includes data loading, as a user's wall clock does (and
        # as bench times the Trainer baseline). A window closes with a device sync.
        if read_now or compiled or setup.device.type == "cpu" or step + 1 == accounts.first_timed:
            accounts.record_times(pending.close_window())
        probe.step_end(step)
        values = accounts.read(pending.read(), batches.consumed, plan, run) if read_now else None
        if read_now and run.eval_every and (step + 1) % run.eval_every == 0:
            eval_loss = evaluate(setup.model, eval_batches, setup.device, run.eval_precision,
                                 setup.policy.autocast_dtype)
        entry = StepLog(step + 1, run.steps, values, peak_allocated=probe.snapshot().peak_allocated if read_now
                        else None, eval_loss=eval_loss, compiled=compiled, **accounts.timing(step))
        if (step + 1) % run.log_every == 0 or step + 1 == run.steps:
            log.step(_metrics_line(entry))
        if on_step:
            on_step(entry)
        if _saves_at(step, run):
            checkpoint = saves.save(accounts.state)  # under --checkpoint-async: in flight
        pending.restart_clock()
        stop_signal = stops.requested() if step + 1 < run.steps else None
        if stop_signal:
            if not read_now:  # the state a stop saves needs the steps' values
                accounts.record_times(pending.close_window())
                accounts.read(pending.read(), batches.consumed, plan, run)
            break
    total_time = time.perf_counter() - run_started
    state = accounts.state
    checkpoint, exports = _final_save(run, setup, saves, state, started, saves.wait() or checkpoint, stop_signal)
    final_loss = accounts.last.loss if accounts.last else state.extra.get("last_loss")
    summary = _summary({**timer.summary(total_time), "compile_cache": compile_cache_dir() if plan.compile else None},
                       probe.snapshot(), final_loss, state, started, eval_loss, stop_signal,
                       loss_implementation(setup.model) if plan.loss == "fused" else None)
    log.summary(summary)
    if stop_signal:
        raise Preempted(stop_signal, state.step, run.steps, checkpoint if run.output else None)
    return RunOutcome(state.step, started, final_loss, summary, checkpoint, exports, eval_loss)


def _metrics_log(run: RunConfig, plan: Plan, started: int) -> MetricsLog:
    """The metrics file, with the dashboards and the chart as its mirrors."""
    resumed_at = started if run.resume else None
    return MetricsLog(run.metrics, resume_from_step=resumed_at, mirrors=open_reports(run, plan, resumed_at))


def _step_timer(setup: TrainingSetup, data, plan: Plan, flops_per_step: int | None,
                peak_flops: float | None) -> StepTimer:
    """The run's timer. Throughput is the whole job's: every data-parallel rank trains its
    own micro-batches; per GPU it is the job's over all its processes."""
    replicas = setup.distributed.layout.data_parallel if setup.distributed is not None else 1
    return StepTimer(samples_per_step=plan.batch_size * plan.grad_accum * replicas,
                     tokens_per_step=data.tokens_per_micro_batch * plan.grad_accum * replicas,
                     flops_per_step=flops_per_step, peak_flops=peak_flops,
                     gpus=setup.distributed.world if setup.distributed is not None else 1)


def default_timing_warmup(plan: Plan) -> int:
    """Steps left out of the rates when RunConfig.timing_warmup is not given: one (the
    allocator grows), two under a compile mode that records CUDA graphs on the call after
    compiling. Steps during which torch.compile compiled are left out on top of these."""
    return 2 if plan.compile and plan.compile_mode != "default" else 1


def _is_read_point(step: int, run: RunConfig) -> bool:
    """Whether the loop reads the steps' values after `step` (counted from 0): to log,
    evaluate, save or finish (and on a stop signal). Between read points nothing waits
    for the device."""
    done = step + 1
    return (done % run.log_every == 0 or done == run.steps or _saves_at(step, run)
            or bool(run.eval_every and done % run.eval_every == 0))


def _saves_at(step: int, run: RunConfig) -> bool:
    return bool(run.output and run.save_every and (step + 1) % run.save_every == 0 and step + 1 < run.steps)


def _one_step(setup: TrainingSetup, batches, plan: Plan, run: RunConfig):
    """(the step's outcome, still on the device; whether torch.compile compiled during it)."""
    compiles_before = compile_events()
    outcome = training_step(setup, batches, plan, skip_non_finite=run.on_nan == "skip")
    return outcome, compile_events() > compiles_before


def _final_save(run: RunConfig, setup: TrainingSetup, saves: CheckpointSaves, state: TrainingState, started: int,
                checkpoint: Path | None, stop_signal: int | None) -> tuple[Path | None, dict]:
    """(the run's last checkpoint, its exports). A run stopped by a signal saves where it
    stopped (unless that step was just saved) and exports nothing; a run that trained saves
    and exports; one that trained nothing names the checkpoint it resumed from. A save in
    flight was completed before (`saves.wait()`)."""
    if not run.output:
        return checkpoint, {}
    if stop_signal:
        if checkpoint is None or checkpoint.name != f"step-{state.step:08d}":
            checkpoint = saves.save_now(state)
        return checkpoint, {}
    if state.step > started:
        checkpoint = saves.save_now(state)
        return checkpoint, _export(run, setup, checkpoint)
    return latest_checkpoint(run.output), {}


def _summary(timing: dict, memory, final_loss: float | None, state: TrainingState, started: int,
             eval_loss: float | None, stop_signal: int | None, fused_loss: str | None = None) -> dict:
    """The metrics file's last line (docs/train.md's summary keys first, then extras).
    `fused_loss`: which fused loss implementation ran (`--loss fused`)."""
    summary = {**timing, "peak_allocated": memory.peak_allocated, "peak_reserved": memory.peak_reserved,
               "device_total": memory.device_total, "final_loss": final_loss, "memory_method": memory.method,
               "steps": state.step - started, "skipped_steps": state.skipped_steps, "eval_loss": eval_loss}
    if stop_signal:
        summary["stopped_by_signal"] = stop_signal
    if fused_loss:
        summary["loss_implementation"] = fused_loss
    return summary


def _export(run: RunConfig, setup: TrainingSetup, checkpoint: Path) -> dict:
    """The final weights as a Hugging Face directory (rank 0 writes it; a distributed run
    exports from its reshardable checkpoint)."""
    if not setup.has_mesh:
        return export_final(run.output, setup.model, tokenizer=_run_tokenizer(run))
    from trainwise.engine.parallel.distributed_checkpoint import export_from_distributed

    return export_from_distributed(run.output, checkpoint, setup, tokenizer=_run_tokenizer(run))


def _run_tokenizer(run: RunConfig):
    """The --tokenizer the run read its data with, saved beside the final model (None: byte tokens)."""
    if not run.tokenizer:
        return None
    from trainwise.engine.data.tokens import LocalTokenizer

    return LocalTokenizer(run.tokenizer).hf_tokenizer


def _resume_state(setup: TrainingSetup, run: RunConfig, plan: Plan) -> TrainingState:
    fresh = TrainingState(step=0, micro_batches_consumed=0, skipped_steps=0, extra={})
    if not run.resume:
        return fresh
    if not run.output:
        raise InputError("--resume", "needs --out DIR (where the checkpoints are)")
    path = _checkpoint_to_resume(setup, run)
    if setup.has_mesh:
        from trainwise.engine.parallel.distributed_checkpoint import load_distributed_checkpoint

        return load_distributed_checkpoint(path, setup=setup, plan=plan)
    return restore_checkpoint(path, model=setup.model, optimizer=setup.optimizer,
                              scheduler=setup.scheduler, scaler=setup.scaler, plan=plan)


def _checkpoint_to_resume(setup: TrainingSetup, run: RunConfig) -> Path:
    """The newest intact checkpoint; one warning line when newer ones were damaged. Under
    torchrun rank 0 checks the files once and tells the others."""
    main = not setup.has_mesh or setup.distributed.is_main
    choice = _choose_checkpoint(run.output) if main else None
    if setup.has_mesh:
        from trainwise.engine.parallel.distributed_checkpoint import _from_rank_zero

        choice = _from_rank_zero(choice)
    path, warning, error = choice
    if error:
        raise InputError("--resume", error)
    if warning and main:
        print(f"trainwise: warning: {warning}", file=sys.stderr, flush=True)
    return Path(path)


def _choose_checkpoint(output) -> tuple[str | None, str | None, str | None]:
    """(path, warning, error) for _checkpoint_to_resume, as plain strings (sent to ranks)."""
    try:
        path, damaged = resumable_checkpoint(output)
    except InputError as err:
        return None, None, err.message
    if path is None:
        return None, None, f"no complete checkpoint in {Path(output) / CHECKPOINTS}"
    passed_over = "; ".join(f"{bad.file} is damaged ({bad.reason})" for bad in damaged)
    warning = f"{passed_over}; resuming from the previous intact checkpoint {path}" if damaged else None
    return str(path), warning, None


def _live_tensors(setup: TrainingSetup):
    """Tensors alive at a step's start: what the CPU memory probe counts as its baseline.
    (DDP's gradient buckets are held in C++ by its reducer and are not among them.)"""
    optimizer = getattr(setup.optimizer, "optim", setup.optimizer)  # ZeRO-1: this rank's own optimizer
    for tensor in itertools.chain(setup.model.parameters(), setup.model.buffers(),
                                  (t for state in optimizer.state.values() for t in state.values())):
        if isinstance(tensor, DTensor):
            yield tensor.to_local()  # this rank's shard is what its memory holds
        elif isinstance(tensor, torch.Tensor):
            yield tensor


def _metrics_line(entry: StepLog) -> dict:
    """One metrics-file line: the step keys of docs/train.md first, then extras."""
    outcome = entry.outcome
    return {"step": entry.step, "loss": outcome.loss, "lr": outcome.lr, "tokens_per_s": entry.tokens_per_s,
            "samples_per_s": entry.samples_per_s, "mfu": entry.mfu, "peak_allocated": entry.peak_allocated,
            "skipped": outcome.skipped, "grad_norm": outcome.grad_norm, "loss_scale": outcome.loss_scale,
            "step_time_s": entry.step_time_s, "step_cpu_s": entry.step_cpu_s, "eval_loss": entry.eval_loss,
            "compiled": entry.compiled, "tokens_per_s_per_gpu": entry.tokens_per_s_per_gpu,
            "samples_per_s_per_gpu": entry.samples_per_s_per_gpu}
