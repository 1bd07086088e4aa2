"""The estimate under a parallel layout: rank 0's memory, and every pipeline rank's beside it.

Each pipeline rank's workload (its stage's blocks, tensor-parallel shapes, the pipeline
chunk as batch) is traced once as a one-device step (predict.py); per_rank.py then sizes
the rank's own model states and communication buffers. Ranks with the same workload share
one trace. The parameter counts stay the whole model's."""

from __future__ import annotations

import dataclasses

from trainwise.estimator.collective_time import Topology
from trainwise.estimator.layout_step import RankCompute, layout_step_time
from trainwise.estimator.per_rank import (RankModel, headless_workload, rank_config, rank_memory, rank_plan,
                                         rank_reshape, rank_views)
from trainwise.estimator.rank_states import rank_parameters
from trainwise.estimator.predict import extrapolate_count, one_device_estimate
from trainwise.estimator.result import EstimateResult
from trainwise.hardware.profile import DeviceProfile
from trainwise.hardware import Device
from trainwise.models import ModelSpec, build_model_with_notes, count_parameters
from trainwise.models.families.checks import check_model_layout
from trainwise.plan.layout import Layout, resolve_layout
from trainwise.plan.plan import Plan
from trainwise.techniques.precision import precision_policy
from trainwise.trace.depth import block_count, depth_fit, extrapolate_by_kind, with_blocks
from trainwise.trace.layer_pattern import layer_pattern


def layout_estimate(spec: ModelSpec, plan: Plan, device: Device, profile: DeviceProfile | None = None,
                    topology: Topology | None = None) -> EstimateResult:
    """Rank 0's estimate under the plan's layout, with every pipeline rank's peak beside it
    (trainwise/estimator/per_rank.py); the parameter counts stay the whole model's. The step
    time (with a profile) is the slowest pipeline rank's under `topology` (default: all
    ranks on one node)."""
    layout = resolve_layout(plan)
    check_model_layout(spec.config, plan, layout)
    traced: dict[tuple, EstimateResult] = {}
    reshape = rank_reshape(spec.config, layout)
    ranks, rank_times, first = [], [], None
    for view in rank_views(spec.config, plan, layout):
        config = rank_config(spec.config, layout, view.blocks)
        key = (view.blocks, view.has_head)
        if key not in traced:
            workload, workload_reshape = (config, reshape) if view.has_head else headless_workload(config, reshape)
            workload_spec = dataclasses.replace(spec, config=workload, vocab_size=workload.vocab_size)
            traced[key] = one_device_estimate(workload_spec, rank_plan(plan, layout), device, workload_reshape,
                                              profile, chunks=layout.microbatches)
        single = traced[key]

        def build(blocks: int | None, config=config):
            shaped = config if blocks is None else with_blocks(config, blocks)
            model = build_model_with_notes(dataclasses.replace(spec, config=shaped), "meta", attention=plan.attention,
                                           batch_size=plan.batch_size, seq_len=plan.seq_len).model
            if reshape is not None:
                reshape(model)
            return model

        rank_model = RankModel(config, build, spec.task)
        memory, details = rank_memory(single.memory, single.activations_by_module, rank_model, plan, layout, view,
                                      device.kind)
        ranks.append({**details, "peak_allocated": memory.peak_allocated, "device_total": memory.device_total,
                      "compute_s": single.time.step_s if single.time else None})
        if single.time is not None:
            policy = precision_policy(plan.precision, device.kind)
            rank_times.append(RankCompute(view, rank_parameters(rank_model, plan, policy, view, layout.tp), single.time))
        first = first or (memory, single)
    memory, single = first
    notes = (*single.notes, "memory is rank 0's: its pipeline stage, data-parallel shard and tensor-parallel slice")
    full = _counts(spec, plan, device)
    return dataclasses.replace(single, model=spec.name, plan=plan, memory=memory, params=full[0],
                               trainable_params=full[1], notes=notes, layout=_summary(layout, ranks),
                               time=layout_step_time(plan, layout, rank_times, profile,
                                                     topology or Topology(gpus_per_node=layout.world),
                                                     getattr(spec.config, "hidden_size", 0)))


def _summary(layout: Layout, ranks: list[dict]) -> dict:
    """The result's "layout" entry: the degrees and every pipeline rank's figures."""
    most = max(range(len(ranks)), key=lambda i: ranks[i]["device_total"])
    return {"description": layout.describe(), "world": layout.world, "dp": layout.dp, "fsdp": layout.fsdp,
            "tp": layout.tp, "pp": layout.pp, "zero": layout.zero, "cpu_offload": layout.cpu_offload,
            "data_parallel": layout.data_parallel_kind, "rank": 0,
            "pipeline_ranks": ranks, "most_loaded_pipeline_rank": most}


def _counts(spec: ModelSpec, plan: Plan, device: Device) -> tuple[int, int]:
    """(parameters, trainable parameters) of the whole model, from meta builds of one and
    two blocks where blocks are identical, else of the depths `depth_fit` traces (blocks
    that differ by design: trainwise/trace/depth.py) or of the whole model."""
    from trainwise.techniques import precision_policy
    from trainwise.techniques.recipe import prepare_model

    fit = depth_fit(spec.config)
    blocks = block_count(spec.config) or 1
    depths = (1, 2) if fit is None or fit.uniform else fit.depths
    if fit is None and not layer_pattern(spec.config, blocks).uniform:
        depths = (blocks,)
    counts = []
    for n in depths:
        built = build_model_with_notes(dataclasses.replace(spec, config=with_blocks(spec.config, n)), "meta",
                                       attention=plan.attention, batch_size=plan.batch_size, seq_len=plan.seq_len)
        model = prepare_model(built.model, plan, precision_policy(plan.precision, device.kind), spec.task)
        counts.append((count_parameters(model), count_parameters(model, trainable_only=True)))
    if len(depths) == 1:
        return counts[0]
    if depths == (1, 2):
        return tuple(extrapolate_count(one, two, 1, 2, blocks) for one, two in zip(*counts))
    return tuple(extrapolate_by_kind(list(values), fit) for values in zip(*counts))
