"""The predicted time of one optimizer step, from the traced step's ops and a device profile.

The memory trace also sums every op's work by kind (trainwise/trace/op_costs.py): ops,
FLOPs and bytes per (phase, micro-step, op class, dtype, recomputed?, head dim). Each kind
meets one rate of the device profile (trainwise/hardware/profile.py), an op of size x taking
`fixed_s + x / per_s`: matmuls and attention on their FLOPs at the dtype's rate (attention
at its head dim's where the profile measured head dims: hardware/profile.py), every
other op on the bytes it reads and writes at the memory rate (element-wise transcendental
functions at the profile's `transcendental` rate where it has one, random numbers at its
`random` rate, inside a compiled region at its `compiled_random` rate where it has one;
each of the three the rate of the row's dtype where calibrate measured one, else fp32's: a
CPU core spends about as long per element on bf16 as on fp32; the optimizer phase's ops at
its `optimizer` rate: a real AdamW step timed on the device), times the profile's
`step_compute_factor` (1.0 unless a profile sets it) and a factor for how much slower a
training step runs each kind of work than the same kernels timed alone, which calibrate
measures on the CPU: `step_contraction_factor` for matmuls and attention (operands fresh
from the previous op instead of hot in cache: 1.2-1.6x), `step_non_matmul_factor` for
element-wise and normalisation work (fresh output buffers, cold operands: several times
slower); the optimizer's measured rate already is a real step's. The host dispatches each
op (`host_s_per_op`, on the CPU measured in a training step; views and other kernel-less
ops a quarter of that; an op recomputed by activation checkpointing
`host_s_per_recomputed_op`, which adds the checkpoint's saved-tensor hooks and the
block's Python run twice; under the selective policy `host_s_per_selective_recomputed_op`,
which adds the policy's Python dispatch of every op of the block, forward and recompute).

* On the CPU, host and compute run on the same cores one after the other: the step is
  their sum.
* On CUDA the host queues kernels ahead of the GPU, so a phase takes the longer of its GPU
  work and its host work; the host's excess over the GPU is "host_overhead".

A deep model's sums are read at full depth on the line through the 2- and 3-block traces
(the work is the same in every block), as memory and FLOPs are. The trace runs at most two
micro-steps; the second stands for every later one, and the optimizer runs once.
--activation-offload adds its PCIe copies to "offload" (estimator/activation_offload_time.py). See
docs/plan.md, "The step-time model", for what this ignores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from trainwise.common.rates import JobRates
from trainwise.estimator.activation_offload_time import activation_offload_seconds
from trainwise.estimator.row_time import (CONTRACTIONS, OPTIMIZER_PHASES, all_rows, byte_kind, compute_dtype,
                                          stepped_seconds)
from trainwise.estimator.step_work import StepWork, step_work
from trainwise.hardware import Device
from trainwise.hardware.peak import peak_flops_for
from trainwise.hardware.profile import CATALOG_RATES, DeviceProfile
from trainwise.hardware.rate import stand_in_dtype
from trainwise.plan.plan import Plan
from trainwise.trace.depth import DepthFit
from trainwise.trace.op_table import OpCosts
from trainwise.trace.step_trace_data import StepTrace

CATEGORIES = ("matmul", "attention", "normalization", "elementwise", "optimizer", "recompute", "host_overhead",
              "data", "communication_exposed", "communication_overlapped", "pipeline_bubble", "offload")
# Not on the critical path: shown for information, not part of step_s.
OFF_CRITICAL_PATH = ("communication_overlapped",)
# Host time of a kernel-less op (a view) next to an op that launches a kernel: 1.7 us vs
# 6.6 us for a view and an add of an 8x8 tensor, eager, on this project's 2-core CPU.
METADATA_HOST_SHARE = 0.25
# Dtypes of element-wise work that calibrate measures rates of its own for, on the CPU
# (trainwise/calibration/memory.py); other rows (fp32, integer, bool) are priced at fp32's.
ELEMENTWISE_DTYPES = ("bf16",)
COMPILED_NOTE = ("--compile (scope {scope}): the compiled regions' element-wise chains priced as fused kernels "
                 "(the bytes entering and leaving each chain, host time per launched kernel and per region call: "
                 "trainwise/trace/fusion.py; host times {host}); compile time is not in the step")
# Phases whose device work the host can run ahead of, on CUDA (recomputation is backward's).
OVERLAP_GROUPS = {"forward": "forward", "backward": "backward", "optimizer": "optimizer", "zero_grad": "optimizer"}


@dataclass(frozen=True)
class StepTime(JobRates):
    """Predicted seconds of one optimizer step (all micro-steps and the optimizer) on one
    device or rank. `tokens_per_s` and `samples_per_s` are the whole job's (all its `gpus`
    devices together; one device: that device's), `*_per_gpu` the job's over its devices."""

    step_s: float
    tokens_per_s: float
    samples_per_s: float
    mfu: float | None  # model FLOPs / step_s / the catalog peak of the plan's dtype
    source: str  # "catalog" or the profile file
    breakdown: dict[str, float]  # seconds per CATEGORIES entry
    correction: float | None = None  # the measured/predicted factor applied, if any
    notes: tuple[str, ...] = field(default=())
    gpus: int = 1  # devices of the job the rates are for

    def to_json(self) -> dict:
        return {"step_s": self.step_s, "tokens_per_s": self.tokens_per_s, "samples_per_s": self.samples_per_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "samples_per_s_per_gpu": self.samples_per_s_per_gpu,
                "gpus": self.gpus, "mfu": self.mfu, "source": self.source, "breakdown": dict(self.breakdown),
                "correction": self.correction, "notes": list(self.notes)}


def predict_step_time(traces: Sequence[StepTrace], fit: DepthFit | None, plan: Plan, device: Device,
                      profile: DeviceProfile | None, model_name: str, chunks: int = 1) -> StepTime | None:
    """The step time of `plan` from its traces (`step_work`), priced by `profile`
    (`price_step`). None without a profile."""
    if profile is None:
        return None
    return price_step(step_work(traces, fit, plan), plan, device, profile, model_name, chunks)


def price_step(work: StepWork, plan: Plan, device: Device, profile: DeviceProfile, model_name: str,
               chunks: int = 1) -> StepTime:
    """The step time of `work` on `device` at `profile`'s rates. `chunks`: traced
    forward-backward passes per micro-step (pipeline chunks of one rank)."""
    costs = work.costs
    weights = micro_step_weights(plan.grad_accum, chunks)
    breakdown = step_breakdown(costs, weights, plan, profile)
    notes = [COMPILED_NOTE.format(scope=plan.compile_scope, host=compiled_host_text(profile))] if plan.compile else []
    notes += matmul_rate_notes(costs, plan, profile)
    notes += byte_rate_notes(costs, profile)
    if plan.activation_offload:
        seconds, note = activation_offload_seconds(work.offload, micro_batch_phase_seconds(
            costs, plan, profile), plan.grad_accum * chunks, profile)
        breakdown["offload"] += seconds
        notes.append(note)
    model_flops = _model_flops(costs, weights)
    return _step_time(breakdown, model_flops, plan, device, profile, model_name, chunks, notes)


def compiled_host_text(profile: DeviceProfile) -> str:
    """The host times a compiled step is priced with, and whether calibrate measured them."""
    def one(seconds: float, measured: float | None) -> str:
        return f"{seconds * 1e6:.3g} us " + ("measured" if measured is not None else "built in, not measured")
    return (f"{one(profile.compiled_kernel_host_s, profile.host_s_per_compiled_kernel)} per kernel, "
            f"{one(profile.compiled_region_host_s, profile.host_s_per_compiled_region)} per region call")


def matmul_rate_notes(costs: OpCosts, plan: Plan, profile: DeviceProfile) -> list[str]:
    """Where the matmul rates came from: an fp8 rate (--float8) measured or the catalog's,
    and any dtype the profile has no rate for, priced at a stand-in's rate instead
    (hardware/rate.py: stand_in_dtype)."""
    dtypes = {compute_dtype(key[3], plan) for key, values, _ in all_rows(costs)
              if key[2] in CONTRACTIONS and values[1] > 0}
    origin = f"measured (the profile {profile.source})" if profile.rates_measured else CATALOG_RATES
    notes = []
    for dtype in sorted(dtypes):
        if dtype not in profile.matmul:
            notes.append(f"{dtype} matmuls priced at the {stand_in_dtype(dtype, profile.matmul)} matmul rate, "
                         f"{origin}: assumed, the profile has no "
                         f"{dtype} rate" + (" (trainwise calibrate measures fp8 on a GPU of compute capability "
                                             "8.9 or newer)" if dtype == "fp8" else ""))
        elif dtype == "fp8":
            notes.append(f"fp8 matmuls at {profile.matmul['fp8'].per_s / 1e12:.3g} TFLOP/s, {origin}")
    return notes


def byte_rate_notes(costs: OpCosts, profile: DeviceProfile) -> list[str]:
    """On the CPU, each dtype of element-wise work priced at the fp32 rate for want of its
    own (an older profile); a GPU's element-wise kernels are bound by the bytes they move
    whatever the dtype: the catalog's one DRAM bandwidth is right for all, and no note."""
    if profile.kind != "cpu":
        return []
    missing: dict[str, set[str]] = {}
    for key, values, _compiled in all_rows(costs):
        dtype, kind = key[3], byte_kind(key, values, profile)
        if (kind is not None and dtype in ELEMENTWISE_DTYPES and values[2] + values[3] > 0
                and dtype not in profile.byte_rates_by_dtype.get(kind, {})):
            missing.setdefault(dtype, set()).add(kind)
    return [f"{dtype} element-wise work ({', '.join(sorted(kinds))}) priced at the fp32 byte rate: assumed, "
            f"the profile has no {dtype} rate; `trainwise calibrate` measures it"
            for dtype, kinds in sorted(missing.items())]


def micro_batch_phase_seconds(costs: OpCosts, plan: Plan, profile: DeviceProfile) -> dict[str, float]:
    """Device seconds of the first micro-batch's forward and backward (recomputation in
    backward), as step_breakdown prices them."""
    seconds = {"forward": 0.0, "backward": 0.0}
    for key, values, compiled in all_rows(costs):
        phase, micro = key[0], key[1]
        if micro == 0 and phase in seconds:
            seconds[phase] += stepped_seconds(key, values, plan, profile, compiled)[1]
    return seconds


def micro_step_weights(grad_accum: int, chunks: int) -> dict[int, int]:
    """How many times each traced micro-step's work runs in one step: the first once, the
    second for every later one (times the pipeline chunks of each)."""
    return {0: chunks, 1: chunks * (grad_accum - 1)}


def step_breakdown(costs: OpCosts, weights: dict[int, int], plan: Plan, profile: DeviceProfile) -> dict[str, float]:
    """Seconds per category for one step (before any correction)."""
    breakdown = dict.fromkeys(CATEGORIES, 0.0)
    device_by_group: dict[tuple[str, int], float] = {}
    host_by_group: dict[tuple[str, int], float] = {}
    for key, values, compiled in all_rows(costs):
        phase, micro, op_class, _dtype, recomputed, _head_dim = key
        times = weights[micro] if phase in ("data", "forward", "backward") else 1
        category, seconds = stepped_seconds(key, values, plan, profile, compiled)
        breakdown[category] += seconds * times
        if phase == "data":
            continue  # the batch is ready before the step's ops are queued
        if compiled:
            host = values[0] * compiled_host_s(op_class, profile)
        else:
            host = (values[0] * _host_s_per_op(recomputed, plan, profile)
                    * (METADATA_HOST_SHARE if op_class == "metadata" else 1.0))
        group = (OVERLAP_GROUPS.get(phase, phase), micro)
        device_by_group[group] = device_by_group.get(group, 0.0) + seconds * times
        host_by_group[group] = host_by_group.get(group, 0.0) + host * times
    if profile.kind == "cpu":
        breakdown["host_overhead"] = sum(host_by_group.values())
    else:
        # The host queues a phase's kernels while the GPU runs earlier ones: the phase takes
        # max(GPU, host), so only the host time beyond the GPU's work is on the critical path.
        breakdown["host_overhead"] = sum(max(0.0, host - device_by_group[group])
                                         for group, host in host_by_group.items())
    return breakdown


def compiled_host_s(op_class: str, profile: DeviceProfile) -> float:
    """Host seconds of one call into a compiled region (op class "region": guards and the
    compiled wrapper's entry) or of one kernel its generated code launches."""
    if op_class == "region":
        return profile.compiled_region_host_s
    return profile.compiled_kernel_host_s


def _host_s_per_op(recomputed: bool, plan: Plan, profile: DeviceProfile) -> float:
    if recomputed and plan.grad_ckpt_policy == "selective" and profile.host_s_per_selective_recomputed_op is not None:
        return profile.host_s_per_selective_recomputed_op
    if recomputed and profile.host_s_per_recomputed_op is not None:
        return profile.host_s_per_recomputed_op
    return profile.host_s_per_op


def _model_flops(costs: OpCosts, weights: dict[int, int]) -> int:
    """Model FLOPs of one step as trainwise/trace/flops.py counts them: matmuls of forward
    and backward (no recomputation) and attention as 3x its forward (backward is twice the
    forward; the kernels' own recomputation is not model work)."""
    total = 0
    for (phase, micro, op_class, _dtype, recomputed, _head_dim), values, _compiled in all_rows(costs):
        if recomputed or phase not in ("forward", "backward"):
            continue
        if op_class == "matmul":
            total += values[1] * weights[micro]
        elif op_class == "attention" and phase == "forward":
            total += 3 * values[1] * weights[micro]
    return total


def _step_time(breakdown: dict[str, float], model_flops: int, plan: Plan, device: Device,
               profile: DeviceProfile, model_name: str, chunks: int, extra_notes=()) -> StepTime:
    key = f"step:{model_name}" if f"step:{model_name}" in profile.corrections else "step"
    correction = profile.corrections.get(key)
    # Whose tokens/s these are (one device's, or a layout's whole job) the throughput line says.
    notes = [f"predicted from the traced ops and the {CATALOG_RATES if profile.source == 'catalog' else 'profile'}"
             f" of {profile.device_name}"]
    notes.extend(extra_notes)
    if correction is not None:
        breakdown = {name: seconds * correction for name, seconds in breakdown.items()}
        notes.append(f"multiplied by {correction:.3f}, the measured/predicted ratio stored as {key!r} in the profile")
    step_s = sum(s for name, s in breakdown.items() if name not in OFF_CRITICAL_PATH)
    samples = plan.batch_size * chunks * plan.grad_accum
    peak, _ = peak_flops_for(device, plan.precision)
    mfu = model_flops / step_s / peak if peak and step_s > 0 else None
    return StepTime(step_s=step_s, tokens_per_s=samples * plan.seq_len / step_s if step_s else 0.0,
                    samples_per_s=samples / step_s if step_s else 0.0, mfu=mfu, source=profile.source,
                    breakdown=breakdown, correction=correction, notes=tuple(notes))
