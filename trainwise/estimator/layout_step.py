"""The step time of a parallel layout for the per-rank estimate: each pipeline rank's traced
compute (its one-device StepTime) with the layout's communication, pipeline bubble and
offload (layout_time.py) added, the slowest rank's being the step's.

The slowest rank sets the step: under a pipeline every stage waits for the slowest, and
that rank's own layout time already holds the bubble of the schedule at its chunk time
((pp - 1) of its chunks per micro-batch), so the maximum over the ranks is the critical
path. Data-parallel ranks of one pipeline rank do the same work and are not told apart."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainwise.estimator.collective_time import Topology
from trainwise.estimator.layout_time import LayoutTime, estimate_layout_time
from trainwise.estimator.step_time import CATEGORIES, StepTime
from trainwise.hardware.profile import DeviceProfile
from trainwise.plan.layout import Layout

# What the one-device trace of a rank cannot hold: the layout model adds these.
_LAYOUT_CATEGORIES = ("optimizer", "communication_exposed", "communication_overlapped", "pipeline_bubble", "offload")


@dataclass(frozen=True)
class LayoutStepTime(StepTime):
    """A StepTime under a layout: the slowest rank's step with its collectives, each a dict
    of name, purpose, bytes (each rank sends into it per step), link, exposed_s, overlapped_s."""

    collectives: tuple[dict, ...] = field(default=())

    def to_json(self) -> dict:
        return {**super().to_json(), "collectives": list(self.collectives)}


@dataclass(frozen=True)
class RankCompute:
    """One pipeline rank as the per-rank estimate knows it: its view (estimator/rank_view.py),
    its parameters (estimator/rank_states.py's rank_parameters, before sharding) and the
    time model's StepTime of its traced workload (all chunks of all micro-batches)."""

    view: object
    params: list
    time: StepTime


def chunk_seconds(time: StepTime, passes: int) -> tuple[float, float, float, dict[str, float]]:
    """(forward, backward, optimizer seconds, compute breakdown) of ONE chunk from a rank's
    StepTime over `passes` chunks. The breakdown has no phases: recomputation is the
    backward's, the rest splits 1 : 2 (a backward computes two products per forward one,
    the inputs' and the weights' gradients)."""
    per_chunk = {k: v / passes for k, v in time.breakdown.items() if k not in _LAYOUT_CATEGORIES and v}
    recompute = per_chunk.get("recompute", 0.0)
    compute = sum(per_chunk.values()) - recompute
    return compute / 3, 2 * compute / 3 + recompute, time.breakdown.get("optimizer", 0.0), per_chunk


def layout_step_time(plan, layout: Layout, ranks: list[RankCompute], profile: DeviceProfile | None,
                     topology: Topology, hidden_size: int) -> LayoutStepTime | None:
    """The layout's step time: every pipeline rank's layout time, the slowest's as the step
    (seconds per optimizer step; tokens/s and samples/s the whole job's: every
    data-parallel replica's samples, over all `layout.world` GPUs)."""
    if profile is None or not ranks or any(r.time is None for r in ranks):
        return None
    passes = plan.grad_accum * layout.microbatches
    timed: list[tuple[LayoutTime, RankCompute]] = []
    for rank in ranks:
        forward, backward, optimizer, breakdown = chunk_seconds(rank.time, passes)
        timed.append((estimate_layout_time(plan, layout, rank.view, rank.params, hidden_size, profile, topology,
                                           forward, backward, optimizer, breakdown), rank))
    slowest, rank = max(timed, key=lambda pair: pair[0].step_s)
    step = slowest.step_s
    samples = plan.batch_size * plan.grad_accum * layout.data_parallel
    flops_s = [r.time.mfu * r.time.step_s for _, r in timed if r.time.mfu is not None]
    mfu = sum(flops_s) / (layout.pp * step) if flops_s and step > 0 else None
    notes = (*rank.time.notes, *slowest.notes,
             f"the slowest of {len(ranks)} pipeline rank(s) (pipeline rank {rank.view.pipeline_rank}): its compute, the layout's "
             f"communication{', pipeline bubble' if layout.pp > 1 else ''}"
             f"{', offload' if layout.cpu_offload else ''}; tokens/s and samples/s are the job's "
             f"({layout.data_parallel} data-parallel replica(s) on {layout.world} GPU(s)), per GPU the job's over {layout.world}")
    return LayoutStepTime(step_s=step, tokens_per_s=samples * plan.seq_len / step if step else 0.0,
                          samples_per_s=samples / step if step else 0.0, mfu=mfu, source=rank.time.source,
                          breakdown={k: slowest.breakdown.get(k, 0.0) for k in CATEGORIES},
                          correction=rank.time.correction, notes=notes, gpus=layout.world,
                          collectives=tuple(_collective_json(c) for c in slowest.collectives))


def _collective_json(collective) -> dict:
    return {"name": collective.name, "purpose": collective.purpose, "bytes": round(collective.bytes_per_step),
            "link": collective.link, "exposed_s": collective.exposed_s, "overlapped_s": collective.overlapped_s}
