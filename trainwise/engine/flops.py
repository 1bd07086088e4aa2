"""Model FLOPs of a training step, counted on fake tensors, and MFU against a catalog peak.

MFU (model FLOPs utilisation) divides the FLOPs the model *needs* per step by the time
taken and the device's peak. So the count runs the plan's recipe without gradient
checkpointing: recomputed forwards are real work for the GPU but not useful work, and
counting them would reward checkpointing. LoRA stays on: frozen weights get no
weight-gradient matmuls, which is a real saving. The count comes from PyTorch's own
FlopCounterMode over a real forward and backward of the model code (no 6N rule)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from trainwise.hardware import Device
from trainwise.plan.plan import Plan
from trainwise.step import compute_loss, precision_policy, prepare_model
from trainwise.trace.fake_model import materialize_fake
from trainwise.trace.moe_kernels import traceable_experts

def _count_cpu_attention_kernels() -> None:
    """The count runs on fake CPU tensors, where SDPA dispatches to a CPU flash kernel that
    PyTorch's counter has no formula for (it has them for the CUDA kernels). Its inputs
    and work are those of the CUDA kernels, so the same formulas apply."""
    from torch.utils import flop_counter

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)

    aten = torch.ops.aten
    pairs = ((getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None), forward),
             (getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None), backward))
    for op, formula in pairs:
        if op is not None and op.default not in flop_counter.flop_registry:
            flop_counter.register_flop_formula(op)(formula)


_count_cpu_attention_kernels()

# The catalog key of the peak rate each precision's matmuls run at.
_PEAK_KEY = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", "bf16-pure": "bf16"}


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one micro-batch (a multiply-add counts 2)."""

    forward: int
    backward: int

    @property
    def total(self) -> int:
        return self.forward + self.backward


def count_training_flops(model: nn.Module, batch_fn, plan: Plan, task: str | None) -> FlopCount:
    """Forward and backward FLOPs of one micro-batch of `plan` for a meta-device `model`.

    `batch_fn()` builds the micro-batch (called under fake mode). The model is consumed."""
    plan = dataclasses.replace(plan, grad_ckpt=False)
    model = prepare_model(model, plan, precision_policy(plan.precision, "cpu"), task)
    with traceable_experts(), FakeTensorMode(allow_non_fake_inputs=False):
        materialize_fake(model, "cpu")
        batch = batch_fn()
        with FlopCounterMode(display=False) as forward_counter:
            loss = compute_loss(model, batch)
        with FlopCounterMode(display=False) as backward_counter:
            loss.backward()
    return FlopCount(forward_counter.get_total_flops(), backward_counter.get_total_flops())


def peak_flops_for(device: Device, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s for the plan's matmul dtype, a label naming it and its source).

    None when the catalog has no peak (the CPU, an unknown GPU): MFU is then not shown
    rather than computed against an invented number."""
    key = _PEAK_KEY[precision]
    if device.gpu is None:
        return None, f"no {key} peak FLOP/s for {device.name} in the catalog: MFU not shown"
    peak = device.gpu.peak(key)
    if peak is None:
        return None, f"{device.gpu.name} has no {key} peak in the catalog: MFU not shown"
    return peak, f"{device.gpu.name} dense {key} peak {peak / 1e12:,.0f} TFLOP/s (catalog)"


def mfu(flops_per_second: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction (0.42 = 42 %), None without a peak."""
    if peak is None or peak <= 0:
        return None
    return flops_per_second / peak
