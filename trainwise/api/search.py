"""`trainwise.api.plan_search`: search every plan for a model on a machine (search/), with
the estimator as the judge of each plan.

    report = plan_search("Llama-3.1-8B", Plan(device="H100", seq_len=2048), fixed={"seq_len", "device"},
                         global_batch=64)
    report.result.ranked[0].plan, report.result.ranked[0].tokens_per_s  # the whole job's; per GPU: tokens_per_s_per_gpu

Everything that can be refused is refused before the first trace (exit 2, one line)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from trainwise.api.compatibility import check_estimate_support, check_request
from trainwise.api.estimate import estimate
from trainwise.api.search_layouts import check_layout_request, layout_candidates
from trainwise.common.errors import InputError
from trainwise.common.frozen_heap import frozen_heap
from trainwise.common.progress import Progress, silent
from trainwise.common.units import human_bytes
from trainwise.estimator.shared_traces import SharedTraces
from trainwise.hardware import Device, resolve_device
from trainwise.hardware.profile import DeviceProfile, profile_for
from trainwise.hardware.profile_settings import check_profile_settings
from trainwise.models import ModelSpec, check_seq_len, resolve_model
from trainwise.models.task_inputs import fit_task_sequence
from trainwise.models.attention import attention_refusal
from trainwise.models.quiet import quiet_transformers
from trainwise.search.compose import Measure
from trainwise.emit.train_line import Launch
from trainwise.search.refine import refine
from trainwise.search.screen_and_confirm import DEFAULT_MARGIN, Evaluator, SearchResult, search, smallest
from trainwise.search.space import ALLOWABLE, Space, build_space, parse_allow
from trainwise.search.why_lost import confirmed_alternatives
from trainwise.search.why_lost_layout import layout_alternatives
from trainwise.plan.plan import Plan

# Knobs that change the memory a plan needs: held fixed, they can make every plan miss.
MEMORY_KNOBS = ("batch_size", "seq_len", "precision", "optim", "grad_ckpt", "attention", "lora_rank", "dp",
                "fsdp", "zero", "cpu_offload", "tp", "pp", "microbatches")
# `train --plan auto` without --global-batch: samples per optimizer step per GPU. Left open,
# the search picks the largest micro-batch that fits (the most tokens/s), which on a small
# model is hundreds of samples per step: minutes before the first step is seen and more rows
# than a small dataset has. 8 per GPU is the Trainer's default per-device batch, the size its
# users' learning rates are tuned for; more is --global-batch N.
AUTO_SAMPLES_PER_GPU = 8


def auto_global_batch(gpus: int) -> int:
    """The global batch `train --plan auto` trains when none is given (samples per step)."""
    return AUTO_SAMPLES_PER_GPU * gpus


ALTERNATIVE_KNOBS = ("grad_ckpt", "attention", "optim", "precision", "lora_rank", "layout")


@dataclass
class PlanReport:
    """What `trainwise plan` shows: the search's result, the alternatives' lines, the space."""

    model: str
    device: Device
    capacity_bytes: int | None
    margin: float
    space: Space
    result: SearchResult
    why_lost: list[tuple[str, object, str]]
    seconds: float


def measure_of(result) -> Measure:
    """An EstimateResult as the search's Measure: the device total, and the step time when
    the estimate has one (`result.time`, None without a device profile)."""
    step = getattr(result, "time", None)
    if step is None:
        return Measure(memory_bytes=result.memory.device_total, step_s=None)
    ideal = step.mfu * step.step_s if step.mfu is not None else None
    return Measure(memory_bytes=result.memory.device_total, step_s=step.step_s,
                   breakdown=dict(step.breakdown), ideal_s=ideal)


def estimate_evaluator(spec: ModelSpec, profile=None, **topology) -> Evaluator:
    """Evaluator backed by `trainwise.api.estimate` (memoized by plan); a compiled plan is
    priced as compiled (its memory is the eager step's, an upper bound), from its eager
    twin's trace when one was estimated (SharedTraces). `topology`: gpus_per_node,
    inter_node_gbps for a layout's communication."""
    seen: dict[Plan, Measure] = {}
    profiles: dict[str, object] = {}  # read once per device, not once per estimate
    shared = SharedTraces()

    def evaluate(plan: Plan) -> Measure:
        if plan not in seen:
            if plan.device not in profiles:
                profiles[plan.device] = profile_for(resolve_device(plan.device), profile) \
                    if not isinstance(profile, DeviceProfile) else profile
            seen[plan] = measure_of(estimate(spec, plan, profile=profiles[plan.device], shared=shared, **topology))
        return seen[plan]
    return evaluate


def capacity_of(device: Device) -> int | None:
    """The memory a plan must fit (bytes): the GPU's; for the CPU, this machine's RAM."""
    if device.memory_bytes is not None:
        return device.memory_bytes
    if device.kind == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    raise InputError("--device", f"{device.name}: its memory is unknown, so no plan can be checked to fit; "
                                 "name the target GPU, e.g. --device H100")


def check_search_request(gpus: int, top: int, margin: float, base: Plan, fixed: frozenset[str],
                         global_batch: int | None) -> None:
    """The numeric arguments, and fixed layout degrees against the global batch."""
    if gpus < 1:
        raise InputError("--gpus", f"must be an int >= 1 (got {gpus})")
    if top < 1:
        raise InputError("--top", f"must be an int >= 1 (got {top})")
    if not 0 <= margin < 1:
        raise InputError("--memory-margin", f"must be a fraction in [0, 1) (got {margin})")
    if global_batch is not None and global_batch < 1:
        raise InputError("--global-batch", f"must be an int >= 1 (got {global_batch})")
    if gpus == 1 and any(k in fixed for k in ("nproc", "dp", "fsdp", "tp", "pp")) and base.is_distributed:
        raise InputError("--gpus", f"1 (the default) cannot hold the layout the flags fix; give --gpus "
                                   f"{max(base.nproc, base.dp * base.fsdp * base.tp * base.pp)}")


def plan_search(model: str | ModelSpec, base: Plan, fixed: set[str] | frozenset[str] = frozenset(), *,
                allow: frozenset[str] = frozenset(), global_batch: int | None = None, gpus: int = 1,
                gpus_per_node: int | None = None, inter_node_gbps: float | None = None, top: int = 3,
                margin: float = DEFAULT_MARGIN, profile=None, task: str | None = None,
                trust_remote_code: bool = False, evaluator: Evaluator | None = None,
                progress: Progress = silent, installed_only: bool | None = None,
                rows: int | None = None) -> PlanReport:
    """Search every plan for `model` on `base.device` x `gpus`; the best `top` that fit.
    `progress` hears how far the screen and the confirmation have got. `installed_only`:
    search only techniques whose packages are installed here (None: when the device is this
    machine's, the CPU or a GPU present; a catalog GPU's run may be elsewhere). `rows`: the
    sequences the training data holds at least, which bound the micro-batch per replica."""
    started = time.perf_counter()
    fixed = frozenset(fixed)
    check_search_request(gpus, top, margin, base, fixed, global_batch)
    check_layout_request(gpus, gpus_per_node, global_batch, base, fixed)
    if gpus > 1:
        base = base.replace(nproc=gpus)  # the layout flags given are read over all the GPUs
    device = resolve_device(base.device)
    if installed_only is None:
        installed_only = device.kind == "cpu" or device.source == "detected"
    # Read (and a CPU profile of other settings refused) before the search, whose failed
    # estimates would otherwise hide the refusal among untraceable plans.
    profile = profile if isinstance(profile, DeviceProfile) else profile_for(device, profile)
    if profile is not None:
        check_profile_settings(profile, "profile")
    capacity = capacity_of(device)
    spec = model if isinstance(model, ModelSpec) else resolve_model(model, task=task, trust_remote_code=trust_remote_code)
    base, _ = fit_task_sequence(base, spec)  # an image classifier's sequence is its patches
    check_seq_len(spec, base.seq_len)
    _check_fixed(base, fixed, device, spec)
    space = build_space(base, fixed, device, allow, global_batch, data_parallel=_fixed_data_parallel(base, fixed),
                        flash_refusal=attention_refusal("flash", device, spec, here=installed_only),
                        attention_refusals=_attention_refusals(device, spec), installed_only=installed_only,
                        rows=rows)
    topology = {"gpus_per_node": gpus_per_node, "inter_node_gbps": inter_node_gbps} if gpus > 1 else {}
    # Every estimate below traces: the imports' objects are kept out of the collector's walks.
    with frozen_heap():
        evaluator = evaluator or estimate_evaluator(spec, profile, **topology)
        extra, notes = (layout_candidates(spec, space, device, profile, gpus, gpus_per_node, inter_node_gbps,
                                          global_batch, progress) if gpus > 1 else ([], []))
        with quiet_transformers():  # model-code warnings (e.g. use_cache under checkpointing) repeat per trace
            result = search(space, device, evaluator, capacity_bytes=capacity, top=top, margin=margin, extra=extra,
                            own_screen=gpus == 1, progress=progress)
            if gpus == 1:  # layouts keep what they were screened with (these techniques are refused there)
                result = refine(result, space, device, evaluator, top)
        result.notes[:0] = notes
        if not result.ranked:
            raise nothing_fits(result, space, device, evaluator, Launch(spec.name, gpus_per_node=gpus_per_node))
        # An alternative that was confirmed is judged by its exact estimate, like the winner.
        confirmed = {c.plan: c for c in result.ranked}
        judged = [confirmed.get(c.plan, c) for c in result.screened]
        lines = confirmed_alternatives(result, judged, ALTERNATIVE_KNOBS if gpus == 1 else ("grad_ckpt",), device,
                                       evaluator)
        if gpus > 1:
            lines += layout_alternatives(result.ranked[0], judged, result.usable_bytes, result.timed)
    return PlanReport(model=spec.name, device=device, capacity_bytes=capacity, margin=margin, space=space,
                      result=result, why_lost=lines, seconds=time.perf_counter() - started)


def _check_fixed(base: Plan, fixed: frozenset[str], device: Device, spec: ModelSpec) -> None:
    """A fixed knob the device or model cannot run, or that estimate cannot price (every
    candidate is judged by its estimate), is refused now, naming its flag; refusals of
    knobs the search chooses only remove those values from the search."""
    try:
        check_request(base, device, spec, here=False)
        check_estimate_support(base)  # else each candidate's refusal reads as "no plan could be traced"
    except InputError as refused:
        if refused.field.lstrip("-").replace("-", "_") in fixed:
            raise


def _attention_refusals(device: Device, spec: ModelSpec) -> dict[str, str]:
    """Why sdpa or eager is not searched: the model's rules; and on a GPU where sdpa runs,
    eager, which keeps the attention matrix sdpa's fused kernels do not and runs slower, so
    it can only lose (as fp32 beside tf32) and is not worth its traces."""
    refusals = {k: r for k in ("sdpa", "eager") if (r := attention_refusal(k, device, spec, here=False))}
    if device.kind == "cuda" and "sdpa" not in refusals:
        refusals.setdefault("eager", "on a GPU sdpa computes the same with less memory and time")
    return refusals


def _fixed_data_parallel(base: Plan, fixed: frozenset[str]) -> int:
    return base.dp * base.fsdp if {"dp", "fsdp"} & fixed else 1


def nothing_fits(result: SearchResult, space: Space, device: Device, evaluator: Evaluator,
                 model: str | Launch) -> InputError:
    """One line: the smallest plan (its train line per node when it spans nodes), what it
    needs against what is usable, what would help."""
    from trainwise.emit.train_line import train_flags

    least = smallest(result.screened)
    if least is None:
        return InputError("--allow", "no plan could be traced for this model and device; see --debug")
    need = evaluator(least.plan).memory_bytes
    usable = result.usable_bytes
    held = [f"--{k.replace('_', '-')} {getattr(space.base, k)}" for k in MEMORY_KNOBS if k in space.fixed]
    helpful = [a for a in ("lora", "adafactor", "adamw-8bit", "bf16-pure") if a not in space.allow
               and (a != "adamw-8bit" or device.kind == "cuda")]
    return InputError("memory", f"no plan fits {device.name} ({human_bytes(usable)} usable with a "
                             f"{space_margin(result, device)} margin): the smallest, `{train_flags(least.plan, model)}`,"
                             f" needs {human_bytes(need)} (predicted), {human_bytes(need - usable)} over"
                             + (f"; held fixed: {', '.join(held)}" if held else "")
                             + (f"; --allow {','.join(helpful)} would add plans that need less memory" if helpful
                                else ""))


def space_margin(result: SearchResult, device: Device) -> str:
    capacity = capacity_of(device)
    return f"{(1 - result.usable_bytes / capacity) * 100:.0f} %"


__all__ = ["PlanReport", "plan_search", "estimate_evaluator", "measure_of", "capacity_of", "ALLOWABLE", "parse_allow"]
