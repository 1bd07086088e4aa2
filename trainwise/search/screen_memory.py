"""A layout rank's memory by arithmetic on a TracedUnit, for the screen: the same parts
as the per-rank estimate (estimator/per_rank.py) without tracing each layout.

* Model states from parameter counts: weights and gradients in the weights' dtype,
  optimizer states per byte of trainable weight as the traced optimizer keeps them;
  FSDP2 shards all three over the shard group, ZeRO-1 the optimizer states; CPU offload
  moves them to the host. Under FSDP2 with accumulation the gradients stay unsharded
  until the last micro-batch (engine/accumulation.py).
* Saved activations of a chunk at the rank's blocks, times the chunks its pipeline
  schedule keeps in flight (plan/partition.py); the head's share only on the rank that
  holds the head.
* The rest of the peak (temporaries, workspaces) as traced, the allocator's slack and the
  device context.
* Communication buffers by the rules of estimator/rank_communication.py: FSDP2's gathered
  blocks (all under ZeRO-2; the running and the prefetched one under ZeRO-3) and one
  block's reduce-scatter input, the pipeline's receive buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainwise.plan.fsdp_settings import FsdpSettings
from trainwise.plan.layout import Layout
from trainwise.plan.partition import balanced_bounds, rank_stages, stage_chunks_in_flight, stages_per_rank
from trainwise.search.traced_unit import TracedUnit


@dataclass(frozen=True)
class ScreenRank:
    """One pipeline rank as the screen sees it."""

    pipeline_rank: int
    blocks: int
    has_embedding: bool
    has_head: bool
    chunks_in_flight: int
    stages: int
    block_ranges: tuple[tuple[int, int], ...] = ()  # as estimator/rank_view.py's RankView


def screen_ranks(total_blocks: int, layout: Layout, schedule: str) -> list[ScreenRank]:
    """Every pipeline rank's blocks, ends and chunks in flight (estimator/rank_view.py's)."""
    if layout.pp == 1:
        return [ScreenRank(0, total_blocks, True, True, 1, 1, ((0, total_blocks),))]
    total = layout.pp * stages_per_rank(schedule)
    bounds = balanced_bounds(total_blocks, total)
    ranks = []
    for rank in range(layout.pp):
        stages = rank_stages(rank, layout.pp, schedule)
        ranks.append(ScreenRank(rank, sum(bounds[s][1] - bounds[s][0] for s in stages), 0 in stages,
                                total - 1 in stages, stage_chunks_in_flight(schedule, rank, layout.pp,
                                                                            layout.microbatches), len(stages),
                                tuple(bounds[s] for s in stages)))
    return ranks


def rank_params(unit: TracedUnit, rank: ScreenRank, pipelined: bool) -> tuple[int, int]:
    """(parameters held, of them in blocks) after the tensor/pipeline split."""
    if not pipelined:
        outside = unit.whole_params
    else:
        outside = unit.first_params * rank.has_embedding + unit.last_params * rank.has_head
    in_blocks = rank.blocks * unit.block_params
    return in_blocks + outside, in_blocks


def state_bytes(unit: TracedUnit, params: int, layout: Layout, weight_bytes: int, grad_accum: int) -> dict[str, int]:
    """Weights, gradients and optimizer states on the device (bytes)."""
    kind = layout.data_parallel_kind
    shards = layout.fsdp if kind == "fsdp" else 1
    trainable = params * unit.trainable_fraction
    weights = params * weight_bytes / shards
    gradients = trainable * weight_bytes / (1 if kind == "fsdp" and grad_accum > 1 else shards)
    optimizer = trainable * weight_bytes * unit.optimizer_per_weight_byte / (layout.fsdp if kind in ("fsdp", "zero1")
                                                                            else 1)
    if layout.cpu_offload:
        return {"weights": 0, "gradients": 0, "optimizer": 0}
    return {"weights": round(weights), "gradients": round(gradients), "optimizer": round(optimizer)}


def communication_bytes(unit: TracedUnit, rank: ScreenRank, layout: Layout, plan, params: int, in_blocks: int,
                        dtypes: dict[str, int], hidden_size: int) -> int:
    """FSDP2's gathered parameters and reduce-scatter input, and pipeline receive buffers."""
    total = 0
    if layout.data_parallel_kind == "fsdp":
        settings = FsdpSettings.for_layout(layout, plan.precision)
        gathered = min(1 + settings.prefetch_blocks, rank.blocks) if settings.reshard_after_forward else rank.blocks
        root = params - in_blocks
        total += (root + gathered * unit.block_params) * dtypes["gather_bytes"]
        total += round(unit.block_params * unit.trainable_fraction) * dtypes["reduce_bytes"]
    return total + _pipeline_buffers(rank, layout, plan, dtypes, hidden_size)


def _pipeline_buffers(rank: ScreenRank, layout: Layout, plan, dtypes: dict[str, int], hidden_size: int) -> int:
    """Receive buffers, one per chunk and direction, in the weights' dtype, for the whole run
    (a sequence slice under sequence parallel, as estimator/rank_communication.py counts them)."""
    if layout.pp == 1:
        return 0
    stages = layout.pp * stages_per_rank(plan.pp_schedule)
    mine = rank_stages(rank.pipeline_rank, layout.pp, plan.pp_schedule)
    directions = sum((s != 0) + (s != stages - 1) for s in mine)
    chunk = layout.chunk_batch * plan.seq_len * hidden_size * dtypes["weight_bytes"]
    return directions * layout.microbatches * (chunk // layout.tp if layout.sequence_parallel else chunk)


def rank_device_total(unit: TracedUnit, rank: ScreenRank, layout: Layout, plan, dtypes: dict[str, int],
                      hidden_size: int) -> int:
    """The rank's predicted device total (bytes): what nvidia-smi would show."""
    pipelined = layout.pp > 1
    params, in_blocks = rank_params(unit, rank, pipelined)
    states = state_bytes(unit, params, layout, dtypes["weight_bytes"], plan.grad_accum)
    rows = layout.chunk_batch
    head = rank.has_head or not pipelined
    activations = figure_at(unit.activations, rows, rank.blocks, head) * rank.chunks_in_flight
    buffers = communication_bytes(unit, rank, layout, plan, params, in_blocks, dtypes, hidden_size)
    # Gradients alive through forward and backward: DDP's buckets, and FSDP2's unsharded
    # ones under accumulation; otherwise the share the traced phase held.
    persistent = layout.data_parallel_kind in ("ddp", "zero1") or (layout.data_parallel_kind == "fsdp"
                                                                   and plan.grad_accum > 1)
    compute_peak = max((states["weights"] + states["optimizer"]
                        + states["gradients"] * (1.0 if persistent else phase.gradient_share)
                        + activations * phase.activation_share
                        + max(figure_at(phase.other, rows, rank.blocks, head), 0) + buffers for phase in unit.phases),
                       default=sum(states.values()) + activations + buffers)
    optimizer_peak = (sum(states.values()) + _pipeline_buffers(rank, layout, plan, dtypes, hidden_size)
                      + _optimizer_temporary(unit, params, layout, dtypes["weight_bytes"]))
    return round(max(compute_peak, optimizer_peak) + unit.slack + unit.context)


def _optimizer_temporary(unit: TracedUnit, params: int, layout: Layout, weight_bytes: int) -> float:
    """The optimizer step's temporaries on the device, at the states' shard."""
    if layout.cpu_offload:
        return 0.0
    shards = layout.fsdp if layout.data_parallel_kind in ("fsdp", "zero1") else 1
    return params * unit.trainable_fraction * weight_bytes * unit.optimizer_temporary_per_weight_byte / shards


def figure_at(line, rows: int, blocks: int, head: bool) -> float:
    """A traced figure at the rank's rows and blocks; the outside-the-blocks share (the
    head's logits and loss) only where the rank holds the head."""
    return line.fixed + (line.per_row * rows if head else 0.0) + line.per_block_row * rows * blocks
