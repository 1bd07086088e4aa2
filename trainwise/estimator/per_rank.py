"""One rank's memory under a parallel layout (DDP, ZeRO-1/2/3, CPU offload, TP, PP).

Two parts, each from what really runs:

* **The rank's model states** (weights, gradients, optimizer states) are sized exactly:
  the model is built on the meta device at the rank's shapes (tensor parallel divides the
  heads, key/value heads, MLP width and vocabulary, as the engine's DTensor plan splits
  them; a pipeline rank holds its stage's blocks, the embeddings on the first stage, the
  final norm and head on the last, and a head tied to the embedding on both), then sharded
  as FSDP2 shards (dimension 0, rank 0 holding the rounded-up share) or
  ZeroRedundancyOptimizer partitions (whole parameters, largest first, to the least loaded
  rank). The optimizer's states are created on fake tensors of those shapes by the real
  optimizer, so Adafactor's factored and 8-bit Adam's quantised states come out as they
  would (rank_shapes.py, rank_states.py).
* **Activations and temporaries** come from the traced one-device step of the rank's
  workload: the same tensor-parallel shapes, the stage's blocks, the pipeline chunk
  (micro-batch / --microbatches) as batch; a pipeline stage holds the activations of as
  many chunks as its schedule keeps in flight (trainwise/plan/partition.py). Under
  tensor parallel the head's rank adds the one tensor the vocab-parallel loss keeps
  beyond the plain cross-entropy (measured; see loss_parallel_extra). These corrections
  are rank_activations.py's; rank_view.py says what a rank holds and which plan it traces.

Communication buffers are added by rule and named as such (rank_communication.py): FSDP2's
all-gathered blocks in the compute dtype, which depend on where in the step the peak
falls, its reduce-scatter input, and the pipeline's receive buffers. DDP's gradient
buckets are the gradients themselves (gradient_as_bucket_view) but live for the whole
run, so they are counted at the peak. Tensor parallel's collectives add nothing that
persists; its vocab-parallel loss adds one tensor (above). This module puts the parts
together into the rank's peak, phase by phase.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from trainwise.estimator.memory import MemoryEstimate
from trainwise.estimator.rank_activations import loss_parallel_extra, sequence_parallel_saving, stage_activations
from trainwise.estimator.rank_communication import Communication
from trainwise.estimator.rank_shapes import headless_workload, rank_config, rank_reshape
from trainwise.estimator.rank_states import STATE_KEYS, rank_parameters, shard_shape, state_bytes
from trainwise.estimator.rank_view import RankModel, RankView, rank_plan, rank_views
from trainwise.plan.layout import Layout
from trainwise.plan.plan import Plan
from trainwise.techniques.precision import precision_policy

# The entry points, wherever each is defined.
__all__ = ["RankModel", "RankView", "headless_workload", "rank_config", "rank_memory", "rank_plan", "rank_reshape",
           "rank_views"]


def rank_memory(single: MemoryEstimate, activations_by_module: dict[str, int], model: RankModel, plan: Plan,
                layout: Layout, view: RankView, device_type: str) -> tuple[MemoryEstimate, dict]:
    """Rank 0 of pipeline rank `view`: (its MemoryEstimate, details for the report).

    `single` is the traced one-device estimate of the rank's workload (rank_config,
    rank_plan), `activations_by_module` its saved activations per module."""
    policy = precision_policy(plan.precision, device_type)
    params = rank_parameters(model, plan, policy, view, layout.tp)
    choice = layout.data_parallel_kind
    shards = layout.fsdp if choice == "fsdp" else 1
    state = state_bytes(params, plan, device_type, shards, layout.fsdp if choice == "zero1" else 1)
    host = 0
    if layout.cpu_offload:
        host = sum(state.values())
        state = dict.fromkeys(STATE_KEYS, 0)
    communication = Communication(params, plan, policy, layout, view, choice,
                                   getattr(model.config, "hidden_size", 0))
    traced_policy = precision_policy(rank_plan(plan, layout).precision, device_type)  # what `single` ran
    activations = (stage_activations(single.activations, activations_by_module, view, model.config)
                   - sequence_parallel_saving(activations_by_module, model, plan, layout, traced_policy, view)
                   + loss_parallel_extra(model, plan, layout, view) * view.chunks_in_flight)
    ratios = {key: (state[key] / getattr(single, key)) if getattr(single, key) else 0.0 for key in STATE_KEYS}
    ratios["activations"] = activations / single.activations if single.activations else 0.0
    gradients_at = _rank_gradients(choice, plan, state["gradients"], ratios["gradients"], shards)
    candidates = [_phase_peak(single, phase, live, ratios, gradients_at, communication)
                  for phase, live in (single.phase_at_peak or {single.peak_phase: single.at_peak}).items()]
    candidates.append(_embedding_backward_peak(model, layout, view, state, activations, traced_policy))
    phase, peak_allocated, at_peak = max(candidates, key=lambda candidate: candidate[1])
    slack = single.peak_reserved - single.peak_allocated  # what the allocator model kept on top
    peak_reserved = peak_allocated + max(slack, 0)
    memory = dataclasses.replace(
        single, weights=state["weights"], gradients=state["gradients"], optimizer=state["optimizer"],
        activations=activations, peak_allocated=peak_allocated, peak_reserved=peak_reserved,
        device_total=peak_reserved + single.context, peak_phase=phase, at_peak=at_peak, phase_peaks={},
        phase_at_peak={}, communication=at_peak.get("communication", 0), host=host)
    details = {**view.to_json(), "parameters": sum(p.copies * math.prod(shard_shape(p.shape, shards)) for p in params),
               "communication_buffers": communication.at(phase, at_peak)}
    return memory, details


def _embedding_backward_peak(model: RankModel, layout: Layout, view: RankView, state: dict,
                             activations: int, traced_policy) -> tuple[str, int, dict]:
    """The end of a chunk's backward on the rank holding the vocab-parallel embedding.
    DTensor's embedding backward makes the weight's gradient whole (vocabulary x hidden)
    before the hook in engine/parallel/tensor_parallel.py cuts the rank's slice out of it:
    for that moment the whole gradient and the slice are both alive, next to every
    gradient of the rank, the weights, the optimizer states and the activations of the
    chunks still in flight. The one-device trace of the rank's shapes never makes the whole
    gradient; on a pipeline's first stage, which holds no logits, this moment is the peak
    (tiny-llama TP 2 x PP 2 read 21 % low without it)."""
    config = model.config  # the rank's: its vocabulary is the tp-th part
    if layout.tp == 1 or not view.has_embedding:
        return "backward", 0, {}
    # Rank 0's rows times tp: up to tp - 1 rows over the whole vocabulary when it is uneven.
    whole = config.vocab_size * layout.tp * config.hidden_size * traced_policy.param_dtype.itemsize
    held = round(activations * (view.chunks_in_flight - 1) / view.chunks_in_flight)
    live = {**{key: state[key] for key in STATE_KEYS}, "activations": held, "temporary": whole}
    return "backward", sum(live.values()), live


def _rank_gradients(choice: str, plan: Plan, gradients: int, ratio: float, shards: int):
    """`at(phase, live)`: the rank's gradient bytes alive at a traced point. DDP's buckets
    (ZeRO-1 runs on DDP) hold them from the first backward on, past zero_grad. FSDP2 skips
    the reduce-scatter until the last micro-batch (engine/accumulation.py), so with
    accumulation the gradients alive in forward and backward are unsharded. Otherwise
    the traced gradients at the rank's share."""
    def at(phase: str, live: dict[str, int]) -> int:
        if choice in ("ddp", "zero1"):
            return gradients
        unsharded = choice == "fsdp" and plan.grad_accum > 1 and phase in ("forward", "backward")
        return round(live.get("gradients", 0) * ratio * (shards if unsharded else 1))
    return at


def _phase_peak(single: MemoryEstimate, phase: str, live: dict[str, int], ratios: dict[str, float],
                gradients_at: Callable[[str, dict], int], communication: "Communication") -> tuple[str, int, dict]:
    """(phase, the rank's peak in it, live bytes per category there): the traced phase's
    composition with model states and activations scaled to the rank's share, plus the
    communication buffers alive at that point. The optimizer step's temporaries scale with
    the states it updates (a sharded optimizer works on shards)."""
    rank_live = dict(live)
    for key, ratio in ratios.items():
        rank_live[key] = round(live.get(key, 0) * ratio)
    rank_live["gradients"] = gradients_at(phase, live)
    if phase in ("optimizer", "zero_grad"):
        rank_live["temporary"] = round(live.get("temporary", 0) * ratios["optimizer"])
    buffers = sum(communication.at(phase, live).values())
    if buffers:
        rank_live["communication"] = buffers
    base = single.phase_peaks.get(phase) or sum(live.values())  # the allocator's rounding stays
    return phase, max(base - sum(live.values()), 0) + sum(rank_live.values()), rank_live
