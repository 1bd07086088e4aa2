"""Model FLOPs of a training step, counted on fake tensors like the memory trace.

MFU (model FLOPs utilisation, trainwise/engine/flops.py) divides the FLOPs the model
*needs* per step by the time taken and the device's peak. So the count runs the plan's
recipe without gradient checkpointing: recomputed forwards are real work for the GPU but
not useful work, and counting them would reward checkpointing. LoRA stays on: frozen
weights get no weight-gradient matmuls, which is a real saving. The count comes from
PyTorch's own FlopCounterMode over a real forward and backward of the model code (no 6N
rule), with the few formulas of flops_formulas.py added (CPU attention kernels,
mixture-of-experts matmuls, attention backward without the flash kernels' recomputation).

Conventions (those of PyTorch's counter and of the usual MFU definition): a multiply-add
is 2 FLOPs; only matmuls, convolutions and attention are counted (norms, activations and
the optimizer are a rounding error and memory-bound); attention counts the full sequence
x sequence score matrix even under a causal mask.

FLOPs are linear in the number of identical blocks (each block does the same matmuls on
the same shapes), so a deep model is counted with 2 and 3 blocks and the line through
those two counts is read at the real depth (trainwise/trace/depth.py), forward and
backward separately; blocks that differ by design (sliding and full attention...) are
counted at one more depth per extra layer kind and read per kind. This keeps an 8B model
at seq 4096 to about a second. The test suite checks the extrapolation equals a full
count."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from trainwise.plan.plan import Plan
from trainwise.techniques import compute_loss, precision_policy, prepare_model
from trainwise.trace.ctc_loss import traceable_ctc_loss
from trainwise.trace.depth import depth_fit, extrapolate_by_kind, with_blocks
from trainwise.trace.fake_model import materialize_fake
from trainwise.trace.flops_formulas import model_flop_formulas
from trainwise.trace.moe_kernels import traceable_experts
from trainwise.trace.plain_batch import PlainBatchMode


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one micro-batch (a multiply-add counts 2)."""

    forward: int
    backward: int

    @property
    def total(self) -> int:
        return self.forward + self.backward


def count_training_flops(model: nn.Module, batch_fn, plan: Plan, task: str | None, *,
                         extrapolate: bool = True) -> FlopCount:
    """Forward and backward FLOPs of one micro-batch of `plan` for a meta-device `model`.

    `batch_fn()` builds the micro-batch (called under fake mode). The model is consumed.
    A Hugging Face model with more than a few blocks is counted at the depths
    trainwise/trace/depth.py `depth_fit` chooses (2 and 3 blocks for identical ones) and
    extrapolated (`extrapolate=False` counts the whole model)."""
    plan = dataclasses.replace(plan, grad_ckpt=False)  # recomputation is not model FLOPs
    fit = depth_fit(getattr(model, "config", None))
    if not (extrapolate and fit is not None and hasattr(model, "_from_config")):
        return _count(model, batch_fn, plan, task)
    counts = [_count(_shorter(model, n), batch_fn, plan, task) for n in fit.depths]
    return FlopCount(extrapolate_by_kind([c.forward for c in counts], fit),
                     extrapolate_by_kind([c.backward for c in counts], fit))


def _shorter(model: nn.Module, blocks: int) -> nn.Module:
    """The same architecture with `blocks` blocks, on the meta device, in the model's dtype."""
    dtype = next(model.parameters()).dtype
    with torch.device("meta"):
        return type(model)._from_config(with_blocks(model.config, blocks), dtype=dtype)


def _count(model: nn.Module, batch_fn, plan: Plan, task: str | None) -> FlopCount:
    # FLOPs depend on shapes, not on the device: the CUDA policy is used because it accepts
    # every precision (the CPU one refuses fp16 and tf32). No autocast: it changes dtypes,
    # not the matmuls run. Unlike the memory trace, transformers may take its graph-tracing
    # path here (a materialised mask, K/V repeated for grouped-query attention): that
    # changes memory, not the FLOPs counted.
    model = prepare_model(model, plan, precision_policy(plan.precision, "cuda"), task)
    formulas = model_flop_formulas()
    with traceable_experts(), traceable_ctc_loss(), FakeTensorMode(allow_non_fake_inputs=False), PlainBatchMode():
        materialize_fake(model, "cpu")
        batch = batch_fn()
        with FlopCounterMode(display=False, custom_mapping=formulas) as forward_counter:
            loss = compute_loss(model, batch)
        with FlopCounterMode(display=False, custom_mapping=formulas) as backward_counter:
            loss.backward()
    return FlopCount(forward_counter.get_total_flops(), backward_counter.get_total_flops())
