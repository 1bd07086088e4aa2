"""What one rank of a parallel layout is, for the per-rank estimate: which pipeline stages
and blocks it holds (RankView), its model (RankModel) and the one-device plan whose traced
step is one pipeline chunk of its work (rank_plan)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from trainwise.trace.depth import block_count
from trainwise.plan.layout import Layout
from trainwise.plan.fsdp_settings import FsdpSettings
from trainwise.plan.partition import (balanced_bounds, pipeline_microbatches, rank_stages, stage_chunks_in_flight,
                                      stages_per_rank)
from trainwise.plan.plan import Plan


@dataclass(frozen=True)
class RankView:
    """What one pipeline rank holds: `blocks` of the model's blocks (its stages' together),
    the embedding and/or the head, and how many chunks' activations it keeps at once."""

    pipeline_rank: int
    stages: tuple[int, ...]
    blocks: int
    block_range: tuple[int, int]  # [first, end) of its first stage, for the report
    has_embedding: bool
    has_head: bool
    chunks_in_flight: int
    # [first, end) of each of its stages, counted in the whole stack: the engine checkpoints
    # blocks by their index there (techniques/checkpointing.py runs before the pipeline split).
    block_ranges: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict:
        return {"pipeline_rank": self.pipeline_rank, "stages": list(self.stages), "blocks": self.blocks,
                "first_stage_blocks": list(self.block_range), "embedding": self.has_embedding,
                "head": self.has_head, "chunks_in_flight": self.chunks_in_flight}


def rank_views(config, plan: Plan, layout: Layout) -> list[RankView]:
    """One view per pipeline rank (a single view holding everything without --pp)."""
    blocks = block_count(config) or 0
    if layout.pp == 1:
        return [RankView(0, (0,), blocks, (0, blocks), True, True, 1, ((0, blocks),))]
    total = layout.pp * stages_per_rank(plan.pp_schedule)
    bounds = balanced_bounds(blocks, total)
    microbatches = pipeline_microbatches(plan, layout.pp)
    views = []
    for rank in range(layout.pp):
        stages = rank_stages(rank, layout.pp, plan.pp_schedule)
        views.append(RankView(rank, tuple(stages), sum(bounds[s][1] - bounds[s][0] for s in stages),
                              bounds[stages[0]], 0 in stages, total - 1 in stages,
                              stage_chunks_in_flight(plan.pp_schedule, rank, layout.pp, microbatches),
                              tuple(bounds[s] for s in stages)))
    return views


@dataclass(frozen=True)
class RankModel:
    """The rank's model: its config (rank_config) and `build(blocks)`, which builds it on
    the meta device with that many blocks (None: as configured)."""

    config: object
    build: Callable[[int | None], nn.Module]
    task: str | None

    @property
    def single_stack(self) -> bool:
        return self.config is not None and not getattr(self.config, "is_encoder_decoder", False)


def rank_plan(plan: Plan, layout: Layout) -> Plan:
    """The one-device plan whose traced step is one pipeline chunk of this rank's work."""
    batch = layout.chunk_batch
    precision = plan.precision
    if layout.data_parallel_kind == "fsdp" and FsdpSettings.for_layout(layout, precision).gathers_bf16:
        # FSDP2's bf16 policy computes on gathered bf16 copies (counted as communication
        # buffers), not on autocast's cached casts of fp32 weights: trace bf16 weights.
        precision = "bf16-pure"
    return plan.replace(batch_size=batch, precision=precision, nproc=1, dp=1, fsdp=1, tp=1, pp=1, zero=None,
                        cpu_offload=False, microbatches=None, sequence_parallel=False)
