"""A training job, from a request to its result: the model resolved, the request checked,
the process group joined, the model built, the data opened, the plan applied
(engine/parallelize.py), FLOPs and the peak counted, memory predicted, the run driven
(engine/run.py) and an out-of-memory turned into advice.

What needs the estimate (the shared refusals, the predicted memory, the advice after an
out-of-memory) comes from the API layer as an `Advisor`: the engine does not import the
estimate's entry points, which sit above it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn

from trainwise.engine.compile_atomic_add import switch_note
from trainwise.engine.data import build_data
from trainwise.engine.data.user_dataset import is_hf_dataset, user_dataset_data
from trainwise.engine.flops import peak_flops_for
from trainwise.engine.output_preflight import check_training_output, count_parameters_of
from trainwise.engine.reports import check_reports
from trainwise.engine.parallel.consistency import check_same_settings, settings_of
from trainwise.engine.parallel.mesh import Distributed, launched_world_size, start_distributed
from trainwise.engine.parallelize import parallelize
from trainwise.engine.run import RunOutcome, StepLog, run_training
from trainwise.engine.run_config import RunConfig
from trainwise.engine.runtime import refusal_of_nondeterminism, runtime_device, seed_everything
from trainwise.hardware import resolve_device
from trainwise.hardware.allocator import GLIBC_DEFAULT, KEPT, keep_freed_memory
from trainwise.models import (ModelSpec, build_model_with_notes, check_seq_len, example_batch, resolve_model,
                              resolve_model_object)
from trainwise.models.build import ATTENTION_IMPLEMENTATIONS
from trainwise.models.pretrained import has_weights, load_pretrained
from trainwise.common.errors import InputError, OutOfMemory
from trainwise.plan.layout import Layout
from trainwise.plan.plan import Plan
from trainwise.trace.flops import count_training_flops


@dataclass
class TrainResult:
    """A finished run. `summary` holds the summary keys of docs/train.md (measured;
    seconds, bytes, per-second rates) plus extras; `predicted` the estimate's memory keys
    for the same plan (bytes, None when the model could not be estimated); `mfu_peak`
    names the peak FLOP/s MFU was computed against."""

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


@dataclass(frozen=True)
class Advisor:
    """What a job asks of the layer that knows the estimate.

    check_request(plan, device, spec, world_size) -> (plan, notes, layout): the shared
        refusals (InputError), `--attention auto` resolved, the Layout on world_size ranks.
    predict_memory(spec, plan) -> the estimate's memory keys (bytes); InputError when the
        model cannot be estimated.
    oom_message(spec, plan, capacity_bytes, step) -> the out-of-memory advice line."""

    check_request: Callable[[Plan, torch.device, ModelSpec | None, int], tuple[Plan, list[str], Layout]]
    predict_memory: Callable[[ModelSpec, Plan], dict]
    oom_message: Callable[[ModelSpec | None, Plan, int | None, int | None], str]


def train_job(model: str | ModelSpec | nn.Module, data: Iterable | None, plan: Plan, run: RunConfig,
              advisor: Advisor, *, task: str | None, trust_remote_code: bool, device_explicit: bool,
              on_step: Callable[[StepLog], None] | None, on_ready: Callable[[TrainResult], None] | None
              ) -> TrainResult:
    """Train `model` with `plan` for `run.steps` optimizer steps (trainwise.api.train's
    contract). Raises InputError for bad input, OutOfMemory when the device runs out."""
    device = runtime_device(plan.device, explicit=device_explicit)
    if plan.device != device.type and not device_explicit:
        plan = plan.replace(device=device.type)
    allocator_notes = [_allocator_note(keep_freed_memory())] if device.type == "cpu" else []
    spec = model_spec(model, task, trust_remote_code)
    # Before any process group or model:
    check_reports(run)
    plan, notes, layout = advisor.check_request(plan, device, spec, launched_world_size())
    distributed = start_distributed(plan, device.type, layout)
    if distributed.has_mesh:
        check_same_settings(settings_of(plan, run), distributed)
        if device.type == "cuda":
            device = torch.device("cuda", distributed.local_rank)
        if not distributed.is_main:  # rank 0 alone writes the metrics file and the dashboards
            run = run.replace(metrics=None, report_to="none")
    # The same seed on every rank: replicas start equal, and shards are cut from one model.
    seed_everything(run.seed, run.deterministic)
    if run.output and distributed.is_main:  # before the build: a run that cannot save is not started
        check_training_output(run.output, plan, run, count_parameters_of(spec or model))
    # A model about to be sharded or cut into stages is built in host memory: each rank
    # then holds only its shards or stages on the device (so ZeRO-3 and pipelines train
    # models one device cannot hold whole).
    build_on = torch.device("cpu") if layout.zero >= 2 or layout.pp > 1 else device
    module, notes_built = _build(model, spec, plan, build_on)
    train_data = _data(data, spec, plan, run, distributed)
    result = TrainResult(module, plan, run, device, {}, None, "", train_data.description, None,
                         allocator_notes + notes + notes_built)
    outcome = _run(result, spec, distributed, train_data, advisor, on_step, on_ready)
    result.outcome, result.summary = outcome, dict(outcome.summary)
    result.summary["mfu_peak"] = result.mfu_peak
    if result.predicted:
        result.summary["predicted"] = result.predicted
    return result


def _run(result: TrainResult, spec: ModelSpec | None, distributed: Distributed, train_data, advisor: Advisor,
         on_step, on_ready) -> RunOutcome:
    """Apply the plan, count, predict, and drive the run; an out-of-memory becomes
    OutOfMemory with advice, a nondeterministic kernel under --deterministic a refusal."""
    plan, run, device, notes = result.plan, result.run, result.device, result.notes
    capacity = _capacity(device)
    step_seen = {"step": None}

    def track(entry: StepLog):
        step_seen["step"] = entry.step
        if on_step:
            on_step(entry)

    try:
        setup = parallelize(result.model, plan, device, run.steps, spec.task if spec else None, distributed)
        result.model = setup.model
        note = switch_note() if plan.compile else None  # the switch stays on for the process
        if note:
            notes.append(note)
        flops, result.mfu_peak = _flops_and_peak(spec, plan, device, notes)
        peak, _ = peak_flops_for(resolve_device(device_name_for_estimate(device)), plan.precision)
        result.predicted = _predicted(spec, plan, device, notes, advisor.predict_memory)
        if on_ready:
            on_ready(result)
        return run_training(setup, train_data, plan, run, flops_per_step=flops, peak_flops=peak, on_step=track)
    except torch.OutOfMemoryError:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise OutOfMemory(advisor.oom_message(spec, plan, capacity, step_seen["step"])) from None
    except RuntimeError as err:
        refusal = refusal_of_nondeterminism(err, run.deterministic)
        if refusal is None:
            raise
        raise refusal from None


def _allocator_note(setting: str) -> str:
    """The line a CPU run shows about the C allocator (hardware/allocator.py)."""
    if setting == KEPT:
        return ("CPU allocator: glibc keeps freed memory (no per-step page faults; set any MALLOC_* variable "
                "to choose otherwise)")
    return f"CPU allocator: {setting}, as set in the environment" if setting != GLIBC_DEFAULT else \
        "CPU allocator: glibc default (glibc refused to keep freed memory)"


def model_spec(model, task: str | None, trust_remote_code: bool) -> ModelSpec | None:
    """The ModelSpec of a catalog name, directory, Hub id or `module:function`; of a
    transformers model object, from its config and head; None for any other nn.Module."""
    if isinstance(model, nn.Module):
        return resolve_model_object(model, task)
    if isinstance(model, ModelSpec):
        return model
    return resolve_model(str(model), task=task, trust_remote_code=trust_remote_code)


def device_name_for_estimate(device: torch.device) -> str:
    """The device name the estimate and the hardware catalog take for a torch device."""
    return "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"


def _build(model, spec: ModelSpec | None, plan: Plan, device: torch.device) -> tuple[nn.Module, list[str]]:
    if isinstance(model, nn.Module):  # the caller's own model and weights, trained in place
        if spec is None:
            return model.to(device), []
        check_seq_len(spec, plan.seq_len)
        check_object_attention(model, plan)
        return model.to(device), ["weights as passed in (a model object)"]
    check_seq_len(spec, plan.seq_len)
    if has_weights(spec):
        module, notes = load_pretrained(spec, device, plan.attention)
        return module, [f"weights loaded from {spec.name}", *notes]
    built = build_model_with_notes(spec, device, attention=plan.attention, batch_size=plan.batch_size,
                                   seq_len=plan.seq_len)
    origin = "catalog config" if spec.source == "catalog" else spec.source
    return built.model, [f"weights initialised at random ({origin}; seed applies)", *built.notes]


def check_object_attention(model: nn.Module, plan: Plan) -> None:
    """A built model keeps the attention it was built with; the plan must name the same one
    (the prediction and the plan's record follow the plan)."""
    built = getattr(model.config, "_attn_implementation", None)
    named = {value: key for key, value in ATTENTION_IMPLEMENTATIONS.items()}.get(built)
    if named is not None and plan.attention not in (named, "auto"):
        raise InputError("plan.attention", f"the model object was built with {named} attention and a built model's "
                                           f"attention is not changed: use Plan(attention={named!r})")


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
    if is_hf_dataset(data):
        return user_dataset_data(data, spec, plan, run, distributed.data_rank, distributed.layout.data_parallel)
    if data is not None:
        return _IterableData(data, plan)
    if spec is None:
        raise InputError("data", "a model object needs `data`: an iterable of batch dicts its forward accepts")
    # Tensor- and pipeline-parallel peers read the same micro-batches; data-parallel ranks disjoint ones.
    return build_data(run, spec, plan, rank=distributed.data_rank, world_size=distributed.layout.data_parallel)


def _capacity(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def _flops_and_peak(spec: ModelSpec | None, plan: Plan, device: torch.device, notes: list[str]):
    """Model FLOPs of one optimizer step (counted on fake tensors) and the peak's label."""
    _, label = peak_flops_for(resolve_device(device_name_for_estimate(device)), plan.precision)
    if spec is None or spec.source == "function":
        notes.append("MFU not shown: FLOPs are counted for catalog and directory models only")
        return None, label
    meta = build_model_with_notes(spec, "meta", attention=plan.attention).model
    documents = plan.packing == "documents"  # rows of packed documents carry position_ids, no mask
    batch_fn = lambda: example_batch(spec, plan.batch_size, plan.seq_len, "cpu", documents=documents)  # noqa: E731
    count = count_training_flops(meta, batch_fn, plan, spec.task)
    # One rank's share: tensor- and pipeline-parallel peers split a replica's work.
    return count.total * plan.grad_accum // (plan.tp * plan.pp), label


def _predicted(spec: ModelSpec | None, plan: Plan, device: torch.device, notes: list[str],
               predict_memory: Callable[[ModelSpec, Plan], dict]) -> dict | None:
    """The estimate's memory keys for this plan on this device, for the summary."""
    if spec is None:
        return None
    predicted_plan = plan.replace(device=device_name_for_estimate(device), compile=False)
    if plan.compile:
        notes.append("the prediction is for the eager model (compile usually needs less)")
    try:
        return predict_memory(spec, predicted_plan)
    except InputError as err:
        notes.append(f"no prediction: {err}")
        return None
