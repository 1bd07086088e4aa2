"""The time a parallel layout adds to one rank's compute: communication by collective
(exposed on the critical path, or overlapped with compute), the pipeline bubble of the
schedule, point-to-point sends, and offload transfers with the host's optimizer step.

    step = accumulation x (chunks x (forward + backward) + bubble)   compute and bubble
         + optimizer / shards                                       (on the host if offloaded)
         + exposed communication + offload transfers

The rank's compute comes in as a RankWork (rank_work.py), from the one-device time model
of the rank's traced workload or from the plan search's screen; the collectives are
layout_collectives.py's and fsdp_time.py's, each priced by collective_time.py on the link
its group uses. docs/plan.md lists the formulas, the overlap assumptions and what is
ignored."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainwise.estimator.activation_offload_time import copy_rates_text
from trainwise.estimator.collective_time import Topology
from trainwise.estimator.fsdp_time import fsdp_collectives
from trainwise.estimator.layout_collectives import (CollectiveTime, Groups, ddp_all_reduce, pipeline_p2p,
                                                   tensor_parallel, zero_one)
from trainwise.estimator.rank_work import RankWork, rank_work, reshards_after_forward
from trainwise.hardware.profile import DeviceProfile
from trainwise.plan.layout import Layout
from trainwise.plan.partition import stages_per_rank

# The host's optimizer step under --cpu-offload (torch's AdamW on the CPU, updating fp32
# shards): about 2.5e8 parameters per second on a server's cores. A rough figure, stated
# in the result's notes; a calibrated profile does not measure it yet.
HOST_OPTIMIZER_PARAMS_PER_S = 2.5e8


@dataclass(frozen=True)
class LayoutTime:
    """One optimizer step of one rank under the layout, seconds. breakdown: the compute
    categories passed through (scaled to the step), "optimizer", "communication_exposed",
    "communication_overlapped" (off the critical path, not in step_s), "pipeline_bubble",
    "offload"."""

    step_s: float
    breakdown: dict[str, float]
    collectives: list[CollectiveTime]
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {"step_s": self.step_s, "breakdown": dict(self.breakdown),
                "collectives": [c.to_json() for c in self.collectives], "notes": list(self.notes)}


def layout_collectives(plan, layout: Layout, work: RankWork, groups: Groups) -> list[CollectiveTime]:
    """Every collective of the rank's step under the layout's data-parallel kind."""
    collectives = tensor_parallel(work, layout, groups)
    collectives += pipeline_p2p(work, layout, groups, stages_per_rank(plan.pp_schedule))
    kind = layout.data_parallel_kind
    if kind == "ddp":
        collectives.append(ddp_all_reduce(work, groups, "dp", "DDP gradient all-reduce (25 MiB buckets)"))
    elif kind == "zero1":
        collectives += zero_one(work, groups)
    elif kind == "fsdp":
        collectives += fsdp_collectives(work, groups, reshards_after_forward(layout, plan.precision))
    return [c for c in collectives if c.bytes_per_step > 0]


def pipeline_bubble_s(plan, layout: Layout, work: RankWork) -> float:
    """Idle seconds per step of a rank in the pipeline's fill and drain: (pp - 1) chunk
    times per micro-batch for GPipe and 1F1B, divided by the stages each rank runs for
    interleaved 1F1B; a fraction (pp - 1) / (v m + pp - 1) of the pipelined time."""
    if layout.pp == 1:
        return 0.0
    return work.grad_accum * (layout.pp - 1) * work.chunk_compute_s / stages_per_rank(plan.pp_schedule)


def offload_seconds(layout: Layout, work: RankWork, profile: DeviceProfile, zero3: bool) -> tuple[float, float, str]:
    """(transfer seconds, host optimizer seconds, note) of FSDP2's CPU offload: the rank's
    parameter shards copied host-to-device before each gather (forward, and backward under
    ZeRO-3, every micro-batch), the gradient shards back once a step (device to host), over PCIe (not
    overlapped), and the optimizer step on the host."""
    shards = layout.fsdp
    params, trainable = work.params / shards, work.trainable_params / shards
    host = trainable / HOST_OPTIMIZER_PARAMS_PER_S
    note = (f"offload: host optimizer step at an assumed {HOST_OPTIMIZER_PARAMS_PER_S:.1e} parameters/s; "
            "host-device copies not overlapped")
    if profile.host_to_device is None:  # the CPU: host and device are one memory
        return 0.0, host, note
    gathers = work.grad_accum * (2 if zero3 else 1)
    transfers = (gathers * profile.host_to_device.seconds(params * work.weight_bytes)
                 + profile.device_to_host_rate.seconds(trainable * work.reduce_bytes))
    return transfers, host, f"{note}; {copy_rates_text(profile)}"


def layout_time(plan, layout: Layout, work: RankWork, profile: DeviceProfile, topology: Topology) -> LayoutTime:
    """One rank's optimizer step under `layout` (the rank described by `work`)."""
    groups = Groups(layout, profile, topology)
    collectives = layout_collectives(plan, layout, work, groups)
    chunks = work.grad_accum * work.chunks
    breakdown = {k: v * chunks for k, v in work.compute_breakdown.items()} or {"compute": chunks * work.chunk_compute_s}
    shards = layout.fsdp if layout.data_parallel_kind in ("fsdp", "zero1") else 1
    optimizer, offload, notes = work.optimizer_s / shards, 0.0, []
    if layout.cpu_offload:
        offload, host, note = offload_seconds(layout, work, profile, reshards_after_forward(layout, plan.precision))
        optimizer, offload = 0.0, offload + host
        notes.append(note)
    breakdown.update(optimizer=optimizer, pipeline_bubble=pipeline_bubble_s(plan, layout, work), offload=offload,
                     communication_exposed=sum(c.exposed_s for c in collectives),
                     communication_overlapped=sum(c.overlapped_s for c in collectives))
    assumed = sorted({link.name for link in groups.link.values() if link.assumed})
    if assumed:
        notes.append(f"{', '.join(assumed)} rate assumed (the profile measured no collectives): "
                     "run trainwise calibrate --nproc N")
    step = sum(v for k, v in breakdown.items() if k != "communication_overlapped")
    return LayoutTime(step, breakdown, collectives, tuple(notes))


def estimate_layout_time(plan, layout: Layout, view, params, hidden_size: int, profile: DeviceProfile,
                         topology: Topology, forward_s: float, backward_s: float, optimizer_s: float,
                         compute_breakdown: dict[str, float] | None = None) -> LayoutTime:
    """The layout time of pipeline rank `view` for estimator/layout_estimate.py: its
    parameters as rank_states.rank_parameters lists them, the model's hidden size, and the
    one-device time model's seconds of one chunk's forward, backward (recompute included)
    and of one optimizer step over the unsharded rank's parameters."""
    work = rank_work(plan, layout, view, params, hidden_size, profile.kind, forward_s, backward_s, optimizer_s,
                     compute_breakdown)
    return layout_time(plan, layout, work, profile, topology)
