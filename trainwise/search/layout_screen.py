"""The layout screen: every layout of N GPUs (layout_enumeration.py) priced without a
per-rank estimate of each. Memory by arithmetic on a few traced units (screen_memory.py,
traced_unit.py: three small traces per tensor-parallel degree, cached), time by the layout
time model (estimator/layout_time.py) on each pipeline rank's compute from the same units.
Candidates come back with exact=False, fastest first; the search drops those that do not
fit and verifies the best with the full estimate."""

from __future__ import annotations

import dataclasses

from trainwise.common.errors import InputError
from trainwise.estimator.collective_time import Topology
from trainwise.estimator.layout_time import LayoutTime, layout_time
from trainwise.estimator.rank_work import RankWork, communicated_bytes, recomputed_blocks
from trainwise.hardware.peak import peak_flops_for
from trainwise.hardware import Device
from trainwise.hardware.profile import DeviceProfile
from trainwise.models import ModelSpec
from trainwise.plan.fsdp_settings import FsdpSettings
from trainwise.plan.layout import Layout, resolve_layout
from trainwise.plan.plan import Plan
from trainwise.search.candidate import Candidate
from trainwise.search.layout_enumeration import LayoutSpace, layout_plans
from trainwise.search.screen_memory import ScreenRank, figure_at, rank_device_total, rank_params, screen_ranks
from trainwise.search.traced_unit import Seconds, TracedUnit, time_model_seconds, traced_unit
from trainwise.trace.depth import block_count

# The note that names a screened plan's most exposed collective (read by why_lost_layout.py).
EXPOSED_NOTE = "most exposed communication: "


def traced_precision(plan: Plan, layout: Layout) -> str:
    """The precision the rank's workload is traced in: bf16-pure where FSDP2 computes on
    gathered bf16 copies (estimator/rank_view.py's rank_plan does the same)."""
    if layout.data_parallel_kind == "fsdp" and FsdpSettings.for_layout(layout, plan.precision).gathers_bf16:
        return "bf16-pure"
    return plan.precision


def rank_work_of(unit: TracedUnit, rank: ScreenRank, layout: Layout, plan: Plan, dtypes: dict[str, int],
                 hidden_size: int) -> RankWork:
    """The RankWork of one pipeline rank from the unit's per-row, per-block figures."""
    params, in_blocks = rank_params(unit, rank, layout.pp > 1)
    rows, head = layout.chunk_batch, rank.has_head or layout.pp == 1
    trainable = round(params * unit.trainable_fraction)
    return RankWork(forward_s=figure_at(unit.forward_s, rows, rank.blocks, head),
                    backward_s=figure_at(unit.backward_s, rows, rank.blocks, head),
                    optimizer_s=unit.optimizer_s_per_param * trainable, params=params, trainable_params=trainable,
                    params_in_blocks=in_blocks, blocks=rank.blocks,
                    weight_bytes=dtypes["weight_bytes"], gather_bytes=dtypes["gather_bytes"],
                    reduce_bytes=dtypes["reduce_bytes"],
                    activation_bytes=rows * plan.seq_len * hidden_size * dtypes["activation_bytes"],
                    grad_accum=plan.grad_accum, chunks=layout.microbatches,
                    recomputed_blocks=recomputed_blocks(plan, rank.block_ranges or ((0, rank.blocks),)),
                    has_embedding=rank.has_embedding, has_head=rank.has_head)


def screen_candidate(spec: ModelSpec, plan: Plan, unit: TracedUnit, profile: DeviceProfile,
                     topology: Topology, device_kind: str) -> Candidate:
    """One layout plan's Candidate: the fullest rank's memory, the slowest rank's time."""
    layout = resolve_layout(plan)
    hidden = spec.config.hidden_size
    dtypes = communicated_bytes(plan.precision, device_kind, layout.data_parallel_kind)
    memory, slowest = 0, None
    for rank in screen_ranks(block_count(spec.config) or 1, layout, plan.pp_schedule):
        memory = max(memory, rank_device_total(unit, rank, layout, plan, dtypes, hidden))
        timed = layout_time(plan, layout, rank_work_of(unit, rank, layout, plan, dtypes, hidden), profile, topology)
        slowest = timed if slowest is None or timed.step_s > slowest.step_s else slowest
    return _candidate(plan, layout, memory, slowest)


def _candidate(plan: Plan, layout: Layout, memory: int, timed: LayoutTime) -> Candidate:
    samples = plan.batch_size * plan.grad_accum * layout.data_parallel
    step = timed.step_s
    exposed = max(timed.collectives, key=lambda c: c.exposed_s, default=None)
    most = (f"{EXPOSED_NOTE}{exposed.purpose} over the {exposed.link} link",) if exposed and exposed.exposed_s else ()
    return Candidate(plan=plan, memory_bytes=memory, step_s=step,
                     tokens_per_s=samples * plan.seq_len / step if step else 0.0,
                     samples_per_s=samples / step if step else 0.0, mfu=None, breakdown=dict(timed.breakdown),
                     exact=False, notes=(f"screened: {layout.describe()}", *most, *timed.notes))


def screen_mfu(candidate: Candidate, unit: TracedUnit, blocks: int, device: Device) -> float | None:
    """Model FLOPs utilisation of a screened plan, rough: 6 x parameters x tokens per step
    (attention's own FLOPs left out) over all GPUs' catalog peak at the plan's precision."""
    peak, _ = peak_flops_for(device, candidate.plan.precision)
    if not peak or not candidate.step_s:
        return None
    params = unit.tp * (unit.block_params * blocks + unit.whole_params)
    tokens = candidate.tokens_per_s * candidate.step_s
    return 6 * params * tokens / candidate.step_s / (peak * resolve_layout(candidate.plan).world)


def screen_layouts(spec: ModelSpec, plan: Plan, device: Device, profile: DeviceProfile | None, space: LayoutSpace,
                   inter_node_gbps: float | None = None, seconds_of: Seconds = time_model_seconds) -> list[Candidate]:
    """Every layout of `space` for `spec` under `plan`'s other knobs, predicted by the
    screen, fastest (tokens/s) first. Memory is the fullest pipeline rank's device total
    (bytes, predicted), not yet checked against the device's capacity."""
    if profile is None:
        raise InputError("--device", f"{device.name} has no rates to time layouts with: name a catalog GPU or run "
                                     "trainwise calibrate on it")
    topology = Topology.from_gbps(space.gpus_per_node, inter_node_gbps)
    candidates, blocks = [], block_count(spec.config) or 1
    for layout_plan in layout_plans(spec.config, plan, space):
        layout = resolve_layout(layout_plan)
        traced = layout_plan.replace(precision=traced_precision(layout_plan, layout))
        unit = traced_unit(spec, traced, device, layout.tp, layout.sequence_parallel, seconds_of, profile)
        candidate = screen_candidate(spec, layout_plan, unit, profile, topology, device.kind)
        candidates.append(dataclasses.replace(candidate, mfu=screen_mfu(candidate, unit, blocks, device)))
    return sorted(candidates, key=lambda c: c.tokens_per_s, reverse=True)
