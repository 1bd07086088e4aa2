"""`trainwise.api.train`: apply a Plan to an unmodified model and train it.

    from trainwise.api import train
    result = train("tiny-llama", plan=Plan(batch_size=8, seq_len=128, device="cpu"),
                   run=RunConfig(steps=50))
    result.summary["tokens_per_s"], result.predicted["peak_allocated"]

`model` is a catalog name, a local Hugging Face directory (its weights are loaded when it
has them), `package.module:function`, a ModelSpec, or an `nn.Module` whose forward takes
a batch dict and returns a loss (then `data` must be an iterable of such batches).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn

from trainwise.api.compatibility import check_request
from trainwise.api.estimate import estimate
from trainwise.api.oom_advice import oom_message
from trainwise.engine.data import build_data
from trainwise.engine.flops import peak_flops_for
from trainwise.trace.flops import count_training_flops
from trainwise.engine.output_preflight import check_training_output, count_parameters_of
from trainwise.engine.parallel.consistency import check_same_settings, settings_of
from trainwise.engine.parallel.mesh import Distributed, launched_world_size, start_distributed
from trainwise.engine.run import RunOutcome, StepLog, run_training
from trainwise.engine.run_config import RunConfig
from trainwise.engine.runtime import refusal_of_nondeterminism, runtime_device, seed_everything
from trainwise.engine.setup import apply_plan
from trainwise.hardware import resolve_device
from trainwise.models import ModelSpec, build_model_with_notes, check_seq_len, example_batch, resolve_model
from trainwise.models.pretrained import has_weights, load_pretrained
from trainwise.plan.errors import InputError, OutOfMemory
from trainwise.plan.partition import check_layout_combination
from trainwise.plan.plan import Plan


@dataclass
class TrainResult:
    """A finished run. `summary` holds DESIGN.md's summary keys (measured; seconds, bytes,
    per-second rates) plus extras; `predicted` the estimate's memory keys for the same plan
    (bytes, None when the model could not be estimated); `mfu_peak` names the peak FLOP/s
    MFU was computed against."""

    model: nn.Module
    plan: Plan
    run: RunConfig
    device: torch.device
    summary: dict
    predicted: dict | None
    mfu_peak: str
    data_description: str
    outcome: RunOutcome
    notes: list[str] = field(default_factory=list)


def train(model: str | ModelSpec | nn.Module = "tiny-llama", data: str | Iterable | None = None,
          plan: Plan | None = None, run: RunConfig | None = None, *, task: str | None = None,
          trust_remote_code: bool = False, device_explicit: bool = True,
          on_step: Callable[[StepLog], None] | None = None,
          on_ready: Callable[["TrainResult"], None] | None = None) -> TrainResult:
    """Train `model` with `plan` for `run.steps` optimizer steps; see the module docstring.

    Raises InputError for bad input (exit 2), OutOfMemory when the device runs out
    (exit 3, with the predicted need and the changes predicted to fit)."""
    plan, run = plan or Plan(), run or RunConfig()
    if isinstance(data, str):
        run, data = run.replace(data=data), None
    device = runtime_device(plan.device, explicit=device_explicit)
    if plan.device != device.type and not device_explicit:
        plan = plan.replace(device=device.type)
    spec = _spec(model, task, trust_remote_code)
    plan, notes = check_train_request(plan, device, spec, launched_world_size())  # before any process group or model
    distributed = start_distributed(plan, device.type)
    if distributed.mesh is not None:
        check_layout_combination(plan, distributed.layout)  # before any model is built
        check_same_settings(settings_of(plan, run), distributed)
        if device.type == "cuda":
            device = torch.device("cuda", distributed.local_rank)
        if not distributed.is_main:  # rank 0 alone writes the metrics file
            run = run.replace(metrics=None)
    # The same seed on every rank: replicas start equal, and shards are cut from one model.
    seed_everything(run.seed, run.deterministic)
    if run.output and distributed.is_main:  # before the build: a run that cannot save is not started
        check_training_output(run.output, plan, run, count_parameters_of(spec or model))
    # A model about to be sharded or cut into stages is built in host memory: each rank
    # then holds only its shards or stages on the device (so ZeRO-3 and pipelines train
    # models one device cannot hold whole).
    build_on = torch.device("cpu") if distributed.layout.zero >= 2 or distributed.layout.pp > 1 else device
    module, notes_built = _build(model, spec, plan, build_on)
    notes += notes_built
    train_data = _data(data, spec, plan, run, distributed)
    result = TrainResult(module, plan, run, device, {}, None, "", train_data.description, None, notes)
    capacity = _capacity(device)
    step_seen = {"step": None}
    try:
        setup = apply_plan(module, plan, device, run.steps, spec.task if spec else None, distributed)
        result.model = setup.model
        flops, result.mfu_peak = _flops_and_peak(spec, plan, device, notes)
        peak, _ = peak_flops_for(resolve_device(_estimate_device_name(device)), plan.precision)
        result.predicted = _predicted(spec, plan, device, notes)
        if on_ready:
            on_ready(result)

        def track(entry: StepLog):
            step_seen["step"] = entry.step
            if on_step:
                on_step(entry)

        outcome = run_training(setup, train_data, plan, run, flops_per_step=flops, peak_flops=peak, on_step=track)
    except torch.OutOfMemoryError:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise OutOfMemory(oom_message(spec, plan, capacity, step_seen["step"])) from None
    except RuntimeError as err:
        refusal = refusal_of_nondeterminism(err, run.deterministic)
        if refusal is None:
            raise
        raise refusal from None
    result.outcome, result.summary = outcome, dict(outcome.summary)
    result.summary["mfu_peak"] = result.mfu_peak
    if result.predicted:
        result.summary["predicted"] = result.predicted
    return result


def check_train_request(plan: Plan, device: torch.device, spec: ModelSpec | None,
                        world_size: int) -> tuple[Plan, list[str]]:
    """The shared refusals (trainwise/api/compatibility.py) for a run of `world_size`
    processes on `device`, here: (the plan with `--attention auto` resolved, notes saying
    what was picked)."""
    return check_request(plan, resolve_device(_estimate_device_name(device)), spec, here=True,
                         world_size=world_size)


def _spec(model, task: str | None, trust_remote_code: bool) -> ModelSpec | None:
    if isinstance(model, nn.Module):
        return None
    if isinstance(model, ModelSpec):
        return model
    return resolve_model(str(model), task=task, trust_remote_code=trust_remote_code)


def _build(model, spec: ModelSpec | None, plan: Plan, device: torch.device) -> tuple[nn.Module, list[str]]:
    if spec is None:
        return model.to(device), []
    check_seq_len(spec, plan.seq_len)
    if has_weights(spec):
        module, notes = load_pretrained(spec, device, plan.attention)
        return module, [f"weights loaded from {spec.name}", *notes]
    built = build_model_with_notes(spec, device, attention=plan.attention, batch_size=plan.batch_size,
                                   seq_len=plan.seq_len)
    origin = "catalog config" if spec.source == "catalog" else spec.source
    return built.model, [f"weights initialised at random ({origin}; seed applies)", *built.notes]


class _IterableData:
    """User-supplied batches. Resuming skips the batches already consumed, so exact resume
    needs an iterable that yields the same sequence each time it is iterated."""

    description = "batches supplied by the caller"

    def __init__(self, batches: Iterable, plan: Plan):
        self._batches = batches
        self.tokens_per_micro_batch = plan.batch_size * plan.seq_len

    def micro_batches(self, start: int = 0):
        return itertools.islice(itertools.cycle(self._batches) if isinstance(self._batches, (list, tuple))
                                else iter(self._batches), start, None)

    def eval_batches(self, n: int) -> list:
        return []


def _data(data, spec: ModelSpec | None, plan: Plan, run: RunConfig, distributed: Distributed):
    if data is not None:
        return _IterableData(data, plan)
    if spec is None:
        raise InputError("data", "a model object needs `data`: an iterable of batch dicts its forward accepts")
    # Tensor- and pipeline-parallel peers read the same micro-batches; data-parallel ranks disjoint ones.
    return build_data(run, spec, plan, rank=distributed.data_rank, world_size=distributed.layout.data_parallel)


def _estimate_device_name(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"


def _capacity(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def _flops_and_peak(spec: ModelSpec | None, plan: Plan, device: torch.device, notes: list[str]):
    """Model FLOPs of one optimizer step (counted on fake tensors) and the peak's label."""
    _, label = peak_flops_for(resolve_device(_estimate_device_name(device)), plan.precision)
    if spec is None or spec.source == "function":
        notes.append("MFU not shown: FLOPs are counted for catalog and directory models only")
        return None, label
    meta = build_model_with_notes(spec, "meta", attention=plan.attention).model
    batch_fn = lambda: example_batch(spec, plan.batch_size, plan.seq_len, device="cpu")  # noqa: E731
    count = count_training_flops(meta, batch_fn, plan, spec.task)
    # One rank's share: tensor- and pipeline-parallel peers split a replica's work.
    return count.total * plan.grad_accum // (plan.tp * plan.pp), label


def _predicted(spec: ModelSpec | None, plan: Plan, device: torch.device, notes: list[str]) -> dict | None:
    """The estimate's memory keys for this plan on this device, for the summary."""
    if spec is None:
        return None
    predicted_plan = plan.replace(device=_estimate_device_name(device), compile=False)
    if plan.compile:
        notes.append("the prediction is for the eager model (compile usually needs less)")
    try:
        return estimate(spec, predicted_plan).memory.to_json()
    except InputError as err:
        notes.append(f"no prediction: {err}")
        return None
