"""`trainwise.api.estimate`: the memory anatomy of one training step, without a GPU."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from trainwise.api.compatibility import check_estimate_support, check_request
from trainwise.estimate.per_rank import (RankModel, rank_config, rank_memory, rank_plan,
                                         headless_workload, rank_reshape, rank_views)
from trainwise.estimate.extrapolate import (CannotSynthesize, extrapolate_dataclass, extrapolated_stacks,
                                             same_timeline, synthesize_trace)
from trainwise.estimate.memory import MemoryEstimate, memory_from_trace
from trainwise.hardware import Device, resolve_device
from trainwise.models import (ModelSpec, build_model_with_notes, check_seq_len, count_parameters, example_batch,
                              resolve_model)
from trainwise.plan.layout import resolve_layout
from trainwise.plan.partition import check_model_layout, data_parallel_choice
from trainwise.plan.plan import Plan
from trainwise.trace.depth import TRACED_BLOCKS, block_count, should_extrapolate, with_blocks
from trainwise.trace.step_trace import StepTrace, trace_training_step


@dataclass(frozen=True)
class EstimateResult:
    """A prediction for one plan on one device. Memory in bytes; counts in parameters."""

    model: str
    task: str
    params: int
    trainable_params: int
    device: Device
    plan: Plan
    memory: MemoryEstimate
    activations_by_module: dict[str, int]  # saved-activation bytes per module (traced blocks)
    traced_blocks: int | None  # blocks really traced when extrapolated, else None
    total_blocks: int | None
    notes: tuple[str, ...] = field(default=())
    # How the traced blocks were extrapolated: "repeated" (the 3-block timeline written out
    # at full depth and replayed), "line" (figures on a line through the 2- and 3-block
    # results, where the blocks do not repeat cleanly), None when not extrapolated.
    extrapolation: str | None = None
    # Under a parallel layout: the degrees, and every pipeline rank's figures (`memory` is
    # rank 0's); None on one device.
    layout: dict | None = None

    @property
    def fits(self) -> bool | None:
        """Whether device_total fits the device's memory; None when the capacity is unknown."""
        capacity = self.device.memory_bytes
        return None if capacity is None else self.memory.device_total <= capacity

    def to_json(self) -> dict:
        capacity = self.device.memory_bytes
        memory = self.memory.to_json()
        memory["device_capacity"] = capacity
        return {"model": self.model, "task": self.task, "params": self.params,
                "trainable_params": self.trainable_params, "device": self.device.kind,
                "device_name": self.device.name, "device_source": self.device.source,
                "plan": self.plan.to_dict(), "memory": memory, "fits": self.fits,
                **({"layout": self.layout} if self.layout else {}),
                "method": "predicted: traced on fake tensors" + (
                    f" ({self.traced_blocks[0]} and {self.traced_blocks[1]} of {self.total_blocks} blocks, extrapolated"
                    f" by {'repeating blocks' if self.extrapolation == 'repeated' else 'a line'})"
                    if self.traced_blocks else ""),
                "notes": list(self.notes)}


def estimate(model: str | ModelSpec, plan: Plan | None = None, *, task: str | None = None,
             trust_remote_code: bool = False) -> EstimateResult:
    """Predict the memory of one training step of `model` under `plan` (bytes; on one
    device, or on rank 0 and each pipeline rank under a parallel layout).

    `model` is a catalog name, a local Hugging Face directory, `package.module:function` or
    a resolved ModelSpec. Nothing is allocated: the model is built on the meta device and
    the step runs on fake tensors."""
    plan = plan or Plan()
    spec = model if isinstance(model, ModelSpec) else resolve_model(model, task=task, trust_remote_code=trust_remote_code)
    device = resolve_device(plan.device)
    plan, picked = check_request(plan, device, spec, here=False)
    check_estimate_support(plan)
    check_seq_len(spec, plan.seq_len)
    per_rank = plan.is_distributed or plan.cpu_offload
    result = _per_rank(spec, plan, device) if per_rank else _one_device(spec, plan, device)
    return dataclasses.replace(result, notes=(*picked, *result.notes)) if picked else result


def _one_device(spec: ModelSpec, plan: Plan, device: Device, reshape=None) -> EstimateResult:
    """The traced one-device estimate; `reshape` changes each built model first (the
    per-rank estimate's tensor-parallel shapes)."""
    blocks = block_count(spec.config)
    if should_extrapolate(blocks):
        small_n, large_n = TRACED_BLOCKS
        small, large = (_trace(dataclasses.replace(spec, config=with_blocks(spec.config, n)), plan, device, reshape)
                        for n in (small_n, large_n))
        memory, extrapolation = _repeated_blocks(small[0], large[0], blocks, device), "repeated"
        if memory is None:
            memory, extrapolation = extrapolate_dataclass(small[1], large[1], small_n, large_n, blocks), "line"
            # Per-phase compositions are not extrapolated: the per-rank estimate then
            # rescales the overall peak's.
            memory = dataclasses.replace(_at_least_allocated(_peak_from_phases(memory)), phase_at_peak={})
        params = _extrapolate_count(small[0].params, large[0].params, small_n, large_n, blocks)
        trainable = _extrapolate_count(small[0].trainable_params, large[0].trainable_params, small_n, large_n, blocks)
        trace, notes, traced = large[0], large[2], (small_n, large_n)
    else:
        trace, memory, notes = _trace(spec, plan, device, reshape)
        params, trainable, traced, extrapolation = trace.params, trace.trainable_params, None, None
    return EstimateResult(model=spec.name, task=spec.task, params=params, trainable_params=trainable,
                          device=device, plan=plan, memory=memory,
                          activations_by_module=_activations_by_module(trace), traced_blocks=traced,
                          total_blocks=blocks, notes=tuple(notes), extrapolation=extrapolation)


def _per_rank(spec: ModelSpec, plan: Plan, device: Device) -> EstimateResult:
    """Rank 0's estimate under the plan's layout, with every pipeline rank's peak beside it
    (trainwise/estimate/per_rank.py); the parameter counts stay the whole model's."""
    layout = resolve_layout(plan)
    check_model_layout(spec.config, plan, layout)
    traced: dict[tuple, EstimateResult] = {}
    reshape = rank_reshape(spec.config, layout)
    ranks, first = [], None
    for view in rank_views(spec.config, plan, layout):
        config = rank_config(spec.config, layout, view.blocks)
        key = (view.blocks, view.has_head)
        if key not in traced:
            workload, workload_reshape = (config, reshape) if view.has_head else headless_workload(config, reshape)
            traced[key] = _one_device(dataclasses.replace(spec, config=workload, vocab_size=workload.vocab_size),
                                      rank_plan(plan, layout), device, workload_reshape)
        single = traced[key]

        def build(blocks: int | None, config=config):
            shaped = config if blocks is None else with_blocks(config, blocks)
            model = build_model_with_notes(dataclasses.replace(spec, config=shaped), "meta", attention=plan.attention,
                                           batch_size=plan.batch_size, seq_len=plan.seq_len).model
            if reshape is not None:
                reshape(model)
            return model

        memory, details = rank_memory(single.memory, single.activations_by_module,
                                      RankModel(config, build, spec.task), plan, layout, view, device.kind)
        ranks.append({**details, "peak_allocated": memory.peak_allocated, "device_total": memory.device_total})
        first = first or (memory, single)
    memory, single = first
    most = max(range(len(ranks)), key=lambda i: ranks[i]["device_total"])
    summary = {"description": layout.describe(), "world": layout.world, "dp": layout.dp, "fsdp": layout.fsdp,
               "tp": layout.tp, "pp": layout.pp, "zero": layout.zero, "cpu_offload": layout.cpu_offload,
               "data_parallel": data_parallel_choice(layout).kind, "rank": 0,
               "pipeline_ranks": ranks, "most_loaded_pipeline_rank": most}
    notes = (*single.notes, "memory is rank 0's: its pipeline stage, data-parallel shard and tensor-parallel slice")
    full = _counts(spec, plan, device)
    return dataclasses.replace(single, model=spec.name, plan=plan, memory=memory, params=full[0],
                               trainable_params=full[1], notes=notes, layout=summary)


def _counts(spec: ModelSpec, plan: Plan, device: Device) -> tuple[int, int]:
    """(parameters, trainable parameters) of the whole model, from meta builds of one and
    two blocks (blocks are identical)."""
    from trainwise.step import precision_policy
    from trainwise.step.recipe import prepare_model

    counts = []
    for n in (1, 2):
        built = build_model_with_notes(dataclasses.replace(spec, config=with_blocks(spec.config, n)), "meta",
                                       attention=plan.attention, batch_size=plan.batch_size, seq_len=plan.seq_len)
        model = prepare_model(built.model, plan, precision_policy(plan.precision, device.kind), spec.task)
        counts.append((count_parameters(model), count_parameters(model, trainable_only=True)))
    blocks = block_count(spec.config) or 1
    return tuple(_extrapolate_count(one, two, 1, 2, blocks) for one, two in zip(*counts))


def _trace(spec: ModelSpec, plan: Plan, device: Device,
           reshape=None) -> tuple[StepTrace, MemoryEstimate, tuple[str, ...]]:
    built = build_model_with_notes(spec, "meta", attention=plan.attention,
                                   batch_size=plan.batch_size, seq_len=plan.seq_len)
    if reshape is not None:
        reshape(built.model)
    batch_fn = lambda: example_batch(spec, plan.batch_size, plan.seq_len, device="cpu")  # noqa: E731
    trace = trace_training_step(built.model, batch_fn, plan, device.kind, task=spec.task)
    return trace, memory_from_trace(trace, device), tuple(built.notes)


def _repeated_blocks(small: StepTrace, large: StepTrace, blocks: int, device: Device) -> MemoryEstimate | None:
    """Memory of the full-depth timeline synthesised from the 3-block trace, or None when
    the blocks do not repeat cleanly: shrunk to 2 blocks, the synthesis must reproduce
    the 2-block trace exactly (trainwise/estimate/extrapolate.py)."""
    stacks = extrapolated_stacks(small, large)
    try:
        if not same_timeline(synthesize_trace(large, stacks, TRACED_BLOCKS[0], small), small):
            return None
        full = synthesize_trace(large, stacks, blocks, small)
    except CannotSynthesize:
        return None
    return memory_from_trace(full, device)


def _peak_from_phases(memory: MemoryEstimate) -> MemoryEstimate:
    """The step's peak is the largest of the extrapolated per-phase peaks: with more blocks
    the peak may move to another phase than in the small traces."""
    if not memory.phase_peaks:
        return memory
    phase, peak = max(memory.phase_peaks.items(), key=lambda item: item[1])
    return dataclasses.replace(memory, peak_allocated=peak, peak_phase=phase)


def _at_least_allocated(memory: MemoryEstimate) -> MemoryEstimate:
    """Reserved memory is extrapolated on its own line; it can never be below allocated."""
    if memory.peak_reserved >= memory.peak_allocated:
        return memory
    reserved = memory.peak_allocated
    return dataclasses.replace(memory, peak_reserved=reserved, device_total=reserved + memory.context)


def _extrapolate_count(small: int, large: int, small_n: int, large_n: int, target: int) -> int:
    return large + (large - small) // (large_n - small_n) * (target - large_n)


def _activations_by_module(trace: StepTrace) -> dict[str, int]:
    totals = Counter()
    for record in trace.records:
        if record.category == "activations" and record.phase == "forward":
            totals[record.module or "(model inputs)"] += record.nbytes
    return dict(totals)
