"""One rank's communication buffers, added by rule: FSDP2's all-gathered parameters and
reduce-scatter input, which depend on where in the step the peak falls, and the
pipeline's receive buffers."""

from __future__ import annotations

import math

import torch

from trainwise.estimator.rank_states import RankParameter
from trainwise.estimator.rank_view import RankView
from trainwise.plan.layout import Layout
from trainwise.plan.fsdp_settings import FsdpSettings
from trainwise.plan.partition import pipeline_microbatches, stages_per_rank
from trainwise.plan.plan import Plan


def gathered_bytes(params: list[RankParameter], compute: torch.dtype | None) -> int:
    """Bytes of the unsharded parameters FSDP2's all-gather produces for `params` (one copy
    each): the compute dtype (None: each one's own), or the parameter's own gathered size
    (float8 weights, one byte each)."""
    return sum(math.prod(p.shape) * (p.gathered_itemsize or (compute or p.dtype).itemsize) for p in params)


class Communication:
    """The rank's communication buffers on the device, in bytes by what they are for, at a
    point of the step (`at(phase, live)`).

    FSDP2 (engine/parallel/fsdp.py) gathers a block's parameters in the compute dtype (bf16
    under its bf16 policy, else the weights' dtype; float8 weights in float8) and
    reduce-scatters its gradients (fp32 under bf16). The root unit (embedding, final norm, head) stays gathered from forward to
    backward. ZeRO-2 keeps every block gathered from its forward to its backward; ZeRO-3
    holds the running block and the prefetched next one in forward, and in backward the
    running, the prefetched and the previous block's reduce-scatter input. A traced peak
    with no gradients yet is the very start of backward: only the last block has been
    gathered (prefetched) and nothing is being reduced (checked against gloo runs in
    tests/test_parallel_engine.py). Under gradient accumulation FSDP2 defers the
    reduce-scatter to the last micro-batch and holds unsharded gradients until then
    (counted in the gradients row at the peak, not here). Pipeline receive buffers (one per chunk and direction,
    in the residual stream's dtype) live for the whole run."""

    def __init__(self, params: list[RankParameter], plan: Plan, policy, layout: Layout, view: RankView, choice: str,
                 hidden_size: int):
        self.fsdp = choice == "fsdp"
        # With accumulation the traced gradients exist from the last micro-batch's start, so
        # they do not tell its start from later; without checkpointing the peak is at the
        # start (activations fall after it), with checkpointing assume later (more buffers).
        self.gradients_mark_progress = plan.grad_accum == 1 or plan.grad_ckpt
        self.settings = FsdpSettings.for_layout(layout, plan.precision)  # what engine/parallel/fsdp.py shards with
        self.blocks = view.blocks
        self.block = self.root = self.reduce_block = 0
        if self.fsdp:
            compute = torch.bfloat16 if self.settings.gathers_bf16 else None

            self.block = gathered_bytes([p for p in params if p.in_block], compute)
            self.root = gathered_bytes([p for p in params if not p.in_block], compute)
            reduce = torch.float32 if compute is not None else None
            self.reduce_block = sum(math.prod(p.shape) * (reduce or p.dtype).itemsize
                                    for p in params if p.in_block and p.trainable)
        self.pipeline = 0
        if layout.pp > 1:
            total = layout.pp * stages_per_rank(plan.pp_schedule)
            directions = sum((s != 0) + (s != total - 1) for s in view.stages)
            microbatches = pipeline_microbatches(plan, layout.pp)
            chunk = layout.chunk_batch * plan.seq_len * hidden_size * policy.param_dtype.itemsize
            if layout.sequence_parallel:  # the stages pass this rank's slice of the sequence
                chunk //= layout.tp
            self.pipeline = directions * microbatches * chunk

    def at(self, phase: str, live: dict[str, int]) -> dict[str, int]:
        buffers = {"pipeline receive buffers": self.pipeline}
        if self.fsdp and phase in ("forward", "backward"):
            backward_started = phase == "backward" and live.get("gradients", 0) > 0 and self.gradients_mark_progress
            prefetched = self.settings.prefetch_blocks
            if not self.settings.reshard_after_forward:
                gathered = self.blocks
            elif phase == "forward" or backward_started:
                gathered = min(1 + prefetched, self.blocks)
            else:
                gathered = min(prefetched, self.blocks)
            buffers["fsdp all-gathered parameters"] = self.root + gathered * self.block
            if backward_started:
                buffers["fsdp reduce-scatter gradients"] = self.reduce_block
        return {name: value for name, value in buffers.items() if value}
