"""The batch shape of a plan written for a launcher that drops some of its parallelism.

A launcher without tensor or pipeline parallel runs every GPU of the plan as a data-parallel
rank, so the same micro-batch and accumulation would train a larger global batch (the 70B
plan's 16 x 1 over 32 sharded replicas is 512 samples; over 64 ranks it would be 1,024).
The shape is recomputed so the global batch stays what the plan trains, or the target is
refused for that plan when it cannot be."""

from __future__ import annotations

from dataclasses import dataclass

from trainwise.common.errors import InputError
from trainwise.plan.partition import pipeline_microbatches
from trainwise.plan.plan import Plan
from trainwise.emit.train_line import world_size


@dataclass(frozen=True)
class BatchShape:
    """Micro-batch and accumulation per data-parallel rank (samples), the ranks, and the note
    that says how and why they differ from the plan's (None when they do not)."""

    micro: int
    accum: int
    replicas: int
    note: str | None = None

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over the whole job."""
        return self.micro * self.accum * self.replicas


def global_batch(plan: Plan) -> int:
    """Samples per optimizer step of `plan`: micro-batch x accumulation x data-parallel degree."""
    return plan.batch_size * plan.grad_accum * plan.dp * plan.fsdp


def batch_shape(plan: Plan, target: str, *, keeps_tp: bool, keeps_pp: bool) -> BatchShape:
    """The shape `target` trains `plan`'s global batch with when it keeps (or drops) tensor and
    pipeline parallel. Without pipeline parallel the micro-batch is at most the plan's pipeline
    chunk (its micro-batch / microbatches), the most one stage held at a time; the rest is
    accumulation. InputError when the global batch does not divide over the new ranks."""
    dropped = [f"{name} {degree}" for name, degree, kept in (("tensor parallel", plan.tp, keeps_tp),
                                                             ("pipeline parallel", plan.pp, keeps_pp))
               if degree > 1 and not kept]
    replicas = plan.dp * plan.fsdp
    if not dropped:
        return BatchShape(plan.batch_size, plan.grad_accum, replicas)
    ranks = world_size(plan) // ((plan.tp if keeps_tp else 1) * (plan.pp if keeps_pp else 1))
    total = global_batch(plan)
    if total % ranks:
        raise InputError("--emit", f"{target} has no {' or '.join(dropped)}, so the plan's {world_size(plan)} GPUs "
                                   f"would be {ranks} data-parallel ranks, and its global batch of {total} samples "
                                   f"does not divide over them; choose another target or plan (--global-batch)")
    per_rank = total // ranks
    largest = plan.batch_size
    if plan.pp > 1 and not keeps_pp:
        largest = max(1, plan.batch_size // pipeline_microbatches(plan, plan.pp))
    micro = max(d for d in range(1, min(largest, per_rank) + 1) if per_rank % d == 0)
    note = (f"batch: {' and '.join(dropped)} dropped ({target} has none here), so {ranks} data-parallel ranks "
            f"instead of {replicas}; micro-batch {micro} x accumulation {per_rank // micro} x {ranks} ranks keeps "
            f"the plan's global batch of {total} samples (this shape was not estimated: check its memory with "
            f"`trainwise estimate`)")
    return BatchShape(micro, per_rank // micro, ranks, note)
