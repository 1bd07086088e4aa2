"""`trainwise.api.estimate`: the memory anatomy of one training step, without a GPU.

The entry point checks the request, then hands it to the estimate itself: one device
(trainwise/estimator/predict.py) or a parallel layout, rank by rank
(trainwise/estimator/layout_estimate.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from trainwise.common.errors import InputError
from trainwise.estimator.result import EstimateResult
from trainwise.hardware import Device, resolve_device
from trainwise.hardware.profile import DeviceProfile, profile_for, with_measured_context
from trainwise.hardware.profile_settings import check_profile_settings
from trainwise.plan.plan import Plan

if TYPE_CHECKING:
    from trainwise.estimator.shared_traces import SharedTraces
    from trainwise.models import ModelSpec

__all__ = ["EstimateResult", "estimate"]


def estimate(model: str | ModelSpec, plan: Plan | None = None, *, task: str | None = None,
             trust_remote_code: bool = False,
             profile: str | Path | DeviceProfile | None = None, gpus_per_node: int | None = None,
             inter_node_gbps: float | None = None, shared: SharedTraces | None = None,
             cache: bool = False) -> EstimateResult:
    """Predict the memory of one training step of `model` under `plan` (bytes; on one
    device, or on rank 0 and each pipeline rank under a parallel layout), and its time
    (seconds, `result.time`) where a device profile is known: `profile` (a file written by
    `trainwise calibrate`, or a DeviceProfile), else the cached calibration of the
    device, else the catalog's figures for a catalog GPU, else no time.

    `model` is a catalog name, a local Hugging Face directory, `package.module:function` or
    a resolved ModelSpec. Under a layout, `gpus_per_node` (default: every rank on one node)
    and `inter_node_gbps` (Gbit/s per GPU between nodes) place the ranks for the
    communication time (trainwise/estimator/collective_time.py). Nothing is allocated: the model is built on the meta device and
    the step runs on fake tensors. `shared`: one device's steps traced by earlier estimates
    (a plan search's), reused for a plan's --compile twin (trainwise/estimator/shared_traces.py).
    `cache`: read and keep a catalog model's one-device estimate in the per-user trace cache
    (trainwise/estimator/trace_cache.py), so the same request again builds and traces nothing."""
    plan = plan or Plan()
    cached = _cached_request(model, plan, task, profile) if cache and shared is None else None
    problem = None
    if cached is not None:
        from trainwise.estimator.trace_cache import read_cached

        hit, problem = read_cached(*cached)
        if hit is not None:
            return hit
        profile = cached[2] if cached[2] is not None else profile  # read once: the trace prices with it too
    result = _traced_estimate(model, plan, task, trust_remote_code, profile, gpus_per_node, inter_node_gbps, shared)
    if cached is not None:
        from trainwise.estimator.trace_cache import write_cached

        problem = write_cached(cached[0], result) or problem
    return dataclasses.replace(result, notes=(*result.notes, problem)) if problem else result


def _cached_request(model, plan: Plan, task: str | None, profile) -> tuple[str, Device, DeviceProfile | None] | None:
    """(the trace cache's key of this request, formed without transformers; the device and
    the profile a cached estimate is read with: estimator/trace_cache.py), or None where the
    request is not cached: a model other than a catalog name, a parallel layout or CPU
    offload (traced rank by rank)."""
    from trainwise.models.catalog import catalog_record_for

    record = catalog_record_for(model) if isinstance(model, str) else None
    if record is None or plan.is_distributed or plan.cpu_offload:
        return None
    from trainwise.estimator.trace_cache import cache_key

    device = resolve_device(plan.device)
    rates = _device_profile(device, profile)
    device = with_measured_context(device, rates)
    return cache_key(record, task, plan, device), device, rates


def _traced_estimate(model, plan: Plan, task, trust_remote_code, profile, gpus_per_node, inter_node_gbps,
                     shared) -> EstimateResult:
    """The request checked, the model resolved and traced: every estimate the cache lacks."""
    from trainwise.api.compatibility import check_estimate_support, check_request
    from trainwise.estimator.collective_time import Topology
    from trainwise.models import ModelSpec, check_seq_len, resolve_model
    from trainwise.plan.layout import resolve_layout

    spec = model if isinstance(model, ModelSpec) else resolve_model(model, task=task, trust_remote_code=trust_remote_code)
    device = resolve_device(plan.device)
    plan, picked = check_request(plan, device, spec, here=False)
    check_estimate_support(plan)
    check_seq_len(spec, plan.seq_len)
    rates = _device_profile(device, profile)
    device = with_measured_context(device, rates)  # the memory estimate's CUDA context, where measured
    per_rank = plan.is_distributed or plan.cpu_offload
    one_node = resolve_layout(plan).world if per_rank else 1
    topology = Topology.from_gbps(one_node if gpus_per_node is None else gpus_per_node, inter_node_gbps)
    result = _per_rank(spec, plan, device, rates, topology) if per_rank else _one_device(spec, plan, device, profile=rates,
                                                                                         shared=shared)
    if plan.compile:
        picked = (*picked, COMPILED_MEMORY_NOTE)
    return dataclasses.replace(result, notes=(*picked, *result.notes)) if picked else result


# The two routes, as names of this module: tests stub them to show that a refused request
# never reaches a model build. Imported when called: a cached estimate traces nothing.
def _one_device(*args, **kwargs) -> EstimateResult:
    from trainwise.estimator.predict import one_device_estimate

    return one_device_estimate(*args, **kwargs)


def _per_rank(*args, **kwargs) -> EstimateResult:
    from trainwise.estimator.layout_estimate import layout_estimate

    return layout_estimate(*args, **kwargs)


# What the memory figures of a compiled plan are (docs/estimate.md, "Compiled steps").
COMPILED_MEMORY_NOTE = ("--compile: the memory figures are the eager step's, an upper bound for the compiled one "
                        "(the compiled graph saves fewer tensors for backward: on a CPU, batch 4 at 64 and 256 "
                        "tokens, the compiled step's measured peak was 5-9 % below this prediction for tiny-llama "
                        "and 18-31 % below for tiny-gpt2; not measured on a GPU); the step time prices the compiled "
                        "regions' fused kernels")


def _device_profile(device: Device, profile: str | Path | DeviceProfile | None) -> DeviceProfile | None:
    """The profile the time prediction uses (trainwise/hardware/profile.py:profile_for)."""
    if not isinstance(profile, DeviceProfile):
        return profile_for(device, profile)
    if profile.kind != device.kind:
        raise InputError("profile", f"a {profile.kind} profile ({profile.device_name}) cannot time the "
                                    f"{device.kind} device {device.name}")
    check_profile_settings(profile, "profile")
    return profile
