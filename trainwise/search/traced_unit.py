"""TracedUnit: what the layout screen needs of a model at one tensor-parallel degree, read
from three small traced one-device estimates of the rank's workload instead of a
per-rank estimate of every layout.

Each figure f (saved activations, the rest of the peak beyond model states and
activations, forward and backward seconds) is taken as linear in the rows of a chunk,
with a part that grows with the blocks a rank holds:

    f(rows, blocks) = fixed + per_row x rows + per_block_row x rows x blocks

and read from traces of 2 blocks at 1 and 2 rows and of 3 blocks at 1 row, at the
tensor-parallel shapes estimator/layout_estimate.py traces (estimator/rank_shapes.py).
Parameter counts per block and outside the blocks come from estimator/rank_states.py's
meta builds. Units are cached by what changes them (`UnitKey`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from trainwise.estimator.layout_step import chunk_seconds
from trainwise.estimator.predict import one_device_estimate
from trainwise.estimator.rank_activations import loss_parallel_extra, sequence_parallel_saving
from trainwise.estimator.rank_shapes import rank_config, rank_reshape
from trainwise.estimator.rank_states import rank_parameters
from trainwise.estimator.rank_view import RankModel, RankView
from trainwise.estimator.result import EstimateResult
from trainwise.hardware import Device
from trainwise.hardware.profile import DeviceProfile
from trainwise.models import ModelSpec, build_model_with_notes
from trainwise.models.families import family_of
from trainwise.plan.layout import Layout
from trainwise.plan.plan import Plan
from trainwise.techniques.precision import precision_policy
from trainwise.trace.depth import with_blocks


@dataclass(frozen=True)
class Linear:
    """fixed + per_row x rows + per_block_row x rows x blocks."""

    fixed: float
    per_row: float
    per_block_row: float

    def at(self, rows: float, blocks: float) -> float:
        return self.fixed + self.per_row * rows + self.per_block_row * rows * blocks

    @classmethod
    def through(cls, two_one: float, two_two: float, three_one: float) -> "Linear":
        """From f(rows=1, blocks=2), f(2, 2) and f(1, 3)."""
        per_block_row = three_one - two_one
        per_row = two_two - two_one - 2 * per_block_row
        return cls(two_one - per_row - 2 * per_block_row, per_row, per_block_row)


@dataclass(frozen=True)
class TracedUnit:
    """One tensor-parallel degree's figures for one rank (bytes, seconds, parameters).

    block_params: one block's parameters at the tp shapes; first_params, last_params,
    whole_params: outside the blocks on the first pipeline stage (embedding), the last
    (final norm, head; a tied head's copy) and a rank holding both ends (no pipeline).
    optimizer_per_weight_byte: optimizer-state bytes per byte of trainable weight as the
    traced optimizer keeps them (AdamW: 2, in the weights' dtype);
    optimizer_temporary_per_weight_byte: what the optimizer step holds beyond the states
    (foreach temporaries), likewise. activations: saved activations of a chunk; phases:
    the forward's and the backward's peak (ComputePhase); slack: the
    allocator's reserve on top; context: the device's fixed context. forward_s,
    backward_s: one chunk's compute (recompute in backward); optimizer_s_per_param: the
    optimizer step's seconds per trainable parameter."""

    tp: int
    sequence_parallel: bool
    block_params: int
    first_params: int
    last_params: int
    whole_params: int
    trainable_fraction: float
    optimizer_per_weight_byte: float
    optimizer_temporary_per_weight_byte: float
    activations: Linear
    phases: tuple["ComputePhase", ...]
    slack: float
    context: int
    forward_s: Linear
    backward_s: Linear
    optimizer_s_per_param: float


@dataclass(frozen=True)
class ComputePhase:
    """The peak of the forward or the backward as traced: `other`, what it holds beyond
    model states and saved activations (temporaries, workspaces, the allocator's rounding),
    and the shares of the chunk's saved activations and of the gradients alive there."""

    name: str
    other: Linear
    activation_share: float
    gradient_share: float


@dataclass(frozen=True)
class UnitKey:
    """What a TracedUnit depends on besides the model."""

    model: str
    tp: int
    sequence_parallel: bool
    seq_len: int
    precision: str  # as traced (bf16-pure where FSDP2 gathers bf16 copies)
    grad_ckpt: bool
    attention: str
    optim: str
    profile: tuple = ()  # the device profile timing it (name, source, corrections); () for none
    others: tuple = ()  # every other knob that may change the trace (loss, kernels, offload, ...), sorted


# Knobs a unit's key never needs: the batch shape and the layout (the screen varies them
# itself), and the device (the cache is per model and profile already).
NOT_IN_KEY = ("batch_size", "grad_accum", "nproc", "dp", "fsdp", "zero", "cpu_offload", "tp", "pp",
              "sequence_parallel", "microbatches", "pp_schedule", "classic", "device", "seq_len", "precision",
              "grad_ckpt", "attention", "optim")


# seconds_of(result) -> (forward_s, backward_s, optimizer_s) of one traced step.
Seconds = Callable[[EstimateResult], tuple[float, float, float]]
_CACHE: dict[UnitKey, TracedUnit] = {}
# The three traced estimates of a unit, shared by its sequence-parallel twin (sequence
# parallel changes no traced shape; only the activations' correction differs).
_TRACES: dict[UnitKey, dict[tuple[int, int], EstimateResult]] = {}


def time_model_seconds(result: EstimateResult) -> tuple[float, float, float]:
    """(forward, backward, optimizer) seconds from the time model's StepTime on the result
    (`result.time`), split as the layout estimate splits a rank's (layout_step.chunk_seconds)."""
    time = getattr(result, "time", None)
    if time is None:
        raise ValueError("the layout screen needs the step-time model's EstimateResult.time (a device profile)")
    forward, backward, optimizer, _ = chunk_seconds(time, 1)
    return forward, backward, optimizer


def traced_unit(spec: ModelSpec, plan: Plan, device: Device, tp: int, sequence_parallel: bool,
                seconds_of: Seconds = time_model_seconds, profile: DeviceProfile | None = None) -> TracedUnit:
    """The unit of `spec` at `tp` under `plan`'s sequence length, precision (as traced),
    checkpointing, attention and optimizer, its traces timed with `profile`; cached."""
    timing = () if profile is None else (profile.device_name, profile.source, tuple(sorted(profile.corrections.items())))
    others = tuple(sorted((k, v) for k, v in plan.to_dict().items() if k not in NOT_IN_KEY))
    key = UnitKey(spec.name, tp, sequence_parallel, plan.seq_len, plan.precision, plan.grad_ckpt, plan.attention,
                  plan.optim, timing, others)
    if key not in _CACHE:
        _CACHE[key] = _trace_unit(spec, plan, device, tp, sequence_parallel, seconds_of, profile, key)
    return _CACHE[key]


def traces_run() -> int:
    """Traced one-device estimates the units cached so far cost (three per shared key)."""
    return 3 * len(_TRACES)


def _traced(spec, plan, device, layout, reshape, profile, key: UnitKey) -> dict[tuple[int, int], EstimateResult]:
    """The estimates at (blocks, rows) = (2, 1), (2, 2), (3, 1), cached without the
    sequence-parallel flag."""
    shared = dataclasses.replace(key, sequence_parallel=False)
    if shared not in _TRACES:
        results = {}
        for blocks, rows in ((2, 1), (2, 2), (3, 1)):
            config = with_blocks(rank_config(spec.config, layout, blocks), blocks)
            workload = dataclasses.replace(spec, config=config, vocab_size=config.vocab_size)
            results[blocks, rows] = one_device_estimate(workload, plan.replace(batch_size=rows), device, reshape,
                                                        profile)
        _TRACES[shared] = results
    return _TRACES[shared]


def _layout(tp: int, sequence_parallel: bool) -> Layout:
    return Layout(world=tp, dp=1, fsdp=1, tp=tp, pp=1, zero=0, cpu_offload=False, sequence_parallel=sequence_parallel)


def _trace_unit(spec, plan, device, tp, sequence_parallel, seconds_of, profile, key) -> TracedUnit:
    layout = _layout(tp, sequence_parallel)
    reshape = rank_reshape(spec.config, layout)
    one_device = plan.replace(nproc=1, dp=1, fsdp=1, tp=1, pp=1, zero=None, cpu_offload=False, microbatches=None,
                              sequence_parallel=False, grad_accum=1)
    results = _traced(spec, one_device, device, layout, reshape, profile, key)
    activations = {(blocks, rows): _rank_activations(result, RankModel(with_blocks(rank_config(
        spec.config, layout, blocks), blocks), None, spec.task), layout, rows)
        for (blocks, rows), result in results.items()}
    counts = _parameter_counts(spec, one_device, device, layout, reshape)
    base = results[2, 1]
    times = {k: seconds_of(r) for k, r in results.items()}
    trainable = base.trainable_params / base.params if base.params else 0.0
    itemsize = precision_policy(one_device.precision, device.kind).param_dtype.itemsize
    line = lambda f: Linear.through(f(2, 1), f(2, 2), f(3, 1))  # noqa: E731
    return TracedUnit(tp=tp, sequence_parallel=sequence_parallel, **counts, trainable_fraction=trainable,
                      optimizer_per_weight_byte=base.memory.optimizer / max(base.trainable_params * itemsize, 1),
                      optimizer_temporary_per_weight_byte=_optimizer_other(base.memory)
                      / max(base.trainable_params * itemsize, 1),
                      activations=line(lambda b, r: activations[b, r]),
                      phases=_phases(results, line),
                      slack=max(base.memory.peak_reserved - base.memory.peak_allocated, 0),
                      context=base.memory.context, forward_s=line(lambda b, r: times[b, r][0]),
                      backward_s=line(lambda b, r: times[b, r][1]),
                      optimizer_s_per_param=times[2, 1][2] / max(base.trainable_params, 1))


_STATES = ("weights", "gradients", "optimizer")


def _phases(results: dict, line) -> tuple[ComputePhase, ...]:
    """The forward's and backward's peaks of the traces as ComputePhases (the whole peak's
    composition where the trace kept no phases)."""
    def live(result, phase):
        memory = result.memory
        return memory.phase_at_peak.get(phase) or (memory.at_peak if phase == memory.peak_phase else None)

    def other(result, phase):
        held = live(result, phase)
        peak = result.memory.phase_peaks.get(phase) or sum(held.values())
        return peak - sum(held.get(k, 0) for k in (*_STATES, "activations"))

    phases = []
    for phase in ("forward", "backward"):
        if any(live(r, phase) is None for r in results.values()):
            continue
        held, memory = live(results[2, 1], phase), results[2, 1].memory
        phases.append(ComputePhase(phase, line(lambda b, r: other(results[b, r], phase)),
                                   held.get("activations", 0) / memory.activations if memory.activations else 0.0,
                                   held.get("gradients", 0) / memory.gradients if memory.gradients else 0.0))
    return tuple(phases)


def _optimizer_other(memory) -> int:
    """Bytes the optimizer step holds beyond the model states (0 where not kept)."""
    live = memory.phase_at_peak.get("optimizer")
    if not live:
        return 0
    return sum(v for k, v in live.items() if k not in _STATES and k != "activations")


def _rank_activations(result: EstimateResult, model: RankModel, layout: Layout, rows: int) -> int:
    """The traced chunk's saved activations as the per-rank estimate corrects them for
    sequence parallel and the vocab-parallel loss (estimator/rank_activations.py)."""
    layout = dataclasses.replace(layout, chunk_batch=rows)
    policy = precision_policy(result.plan.precision, result.device.kind)
    plan = result.plan.replace(tp=layout.tp, sequence_parallel=layout.sequence_parallel)
    saving = sequence_parallel_saving(result.activations_by_module, model, plan, layout, policy)
    whole_view = RankView(0, (0,), 0, (0, 0), True, True, 1)
    return result.memory.activations - saving + loss_parallel_extra(model, plan, layout, whole_view)


def _parameter_counts(spec, plan, device, layout, reshape) -> dict[str, int]:
    """Parameters per block and outside the blocks at the rank's shapes, from one-block
    meta builds of the whole model and, where the family can be pipelined, of each end."""
    config = rank_config(spec.config, layout, 1)

    def build(blocks):
        shaped = config if blocks is None else with_blocks(config, blocks)
        model = build_model_with_notes(dataclasses.replace(spec, config=shaped), "meta", attention=plan.attention,
                                       batch_size=1, seq_len=plan.seq_len).model
        if reshape is not None:
            reshape(model)
        return model

    model = RankModel(config, build, spec.task)
    policy = precision_policy(plan.precision, device.kind)
    ends = {"whole": (True, True)}
    if family_of(spec.config) is not None and family_of(spec.config).pipeline is not None:
        ends.update(first=(True, False), last=(False, True))
    counts = {}
    for name, (first, last) in ends.items():
        params = rank_parameters(model, plan, policy, RankView(0, (0,), 1, (0, 1), first, last, 1), layout.tp)
        counts[name] = sum(p.copies * _elements(p.shape) for p in params if not p.in_block)
        counts["block"] = sum(_elements(p.shape) for p in params if p.in_block)
    return {"block_params": counts["block"], "whole_params": counts["whole"],
            "first_params": counts.get("first", counts["whole"]), "last_params": counts.get("last", counts["whole"])}


def _elements(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
