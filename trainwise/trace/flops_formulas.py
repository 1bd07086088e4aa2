"""FLOP formulas the count adds to PyTorch's FlopCounterMode, each for a stated reason.

They are passed per counter (`custom_mapping`), not registered in torch's global table, so
other users of FlopCounterMode in the same process see PyTorch's own figures.

* The CPU flash-attention kernels (what SDPA dispatches to on the fake CPU tensors the
  count runs on) have no formula; their work is that of the CUDA attention kernels.
* PyTorch's FlashAttention-2 op (`aten._flash_attention_forward`, what `--attention flash`
  traces: models/flash_trace.py) takes its inputs as (batch, seq, heads, head_dim), but
  PyTorch's formula for it reads them as (batch, heads, seq, head_dim), which counts
  heads x heads x seq instead of seq x seq x heads: about 2,000 times too few FLOPs at
  sequence 2048 and 32 heads. The count reads flash's own layout.
* Attention backward counts 4 matmuls, twice the forward's 2 (dQ, dK, dV and the score
  gradient). PyTorch's formulas also count the score matrix the flash kernels recompute in
  backward, since they do not keep it; that is kernel work, not model work, and counting
  it would make `--attention eager` and `sdpa` report different model FLOPs.
* Mixture-of-experts layers run through transformers' grouped-matmul fallback op on fake
  tensors (moe_kernels.py), which PyTorch cannot see into. Whatever the
  routing, the rows multiplied are tokens x top-k, so the count is routing-independent.
  Backward multiplies by the expert weights (input gradient) and, only when they train,
  by the inputs (weight gradient: none for experts frozen under LoRA)."""

from __future__ import annotations

import functools

import torch
from torch.utils.flop_counter import sdpa_flop_count


def _attention_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return 2 * sdpa_flop_count(query, key, value)


def flash_layout(shape) -> tuple:
    """A flash kernel's (batch, seq, heads, head_dim) shape as SDPA's (batch, heads, seq, head_dim)."""
    batch, seq, heads, dim = shape
    return (batch, heads, seq, dim)


def _flash_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    # Padded rows only (cum_seq_q None): the stand-in the estimate traces never packs them.
    return sdpa_flop_count(flash_layout(query), flash_layout(key), flash_layout(value))


def _flash_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return 2 * sdpa_flop_count(flash_layout(query), flash_layout(key), flash_layout(value))


def _grouped_mm_forward(input, weight, offs, out_val=None) -> int:
    rows, inner = input.shape
    return 2 * rows * inner * weight.shape[-1]


def _grouped_mm_backward(input, weight, offs, grad_output, out_val=None) -> int:
    one_product = _grouped_mm_forward(input, weight, offs)
    return one_product * (2 if weight.requires_grad else 1)


# Needs the tensors themselves (whether the weights train), not only their shapes.
_grouped_mm_backward._get_raw = True
_grouped_mm_forward._get_raw = True


@functools.cache
def model_flop_formulas() -> dict:
    """{op overload packet: formula} to pass as FlopCounterMode(custom_mapping=...)."""
    aten = torch.ops.aten
    formulas = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu",):
        if hasattr(aten, name):
            formulas[getattr(aten, name)] = _attention_forward
    for name in ("_scaled_dot_product_flash_attention_for_cpu_backward",
                 "_scaled_dot_product_flash_attention_backward",
                 "_scaled_dot_product_efficient_attention_backward",
                 "_scaled_dot_product_cudnn_attention_backward"):
        if hasattr(aten, name):
            formulas[getattr(aten, name)] = _attention_backward
    if hasattr(aten, "_flash_attention_forward"):
        formulas[aten._flash_attention_forward] = _flash_forward
        formulas[aten._flash_attention_backward] = _flash_backward
    formulas.update(_moe_formulas())
    return formulas


def _moe_formulas() -> dict:
    try:
        import transformers.integrations.moe  # noqa: F401 - defines the transformers:: ops
    except ImportError:
        return {}
    ops = torch.ops.transformers
    if not hasattr(ops, "grouped_mm_fallback"):
        return {}
    formulas = {ops.grouped_mm_fallback: _grouped_mm_forward}
    if hasattr(ops, "grouped_mm_fallback_backward"):
        formulas[ops.grouped_mm_fallback_backward] = _grouped_mm_backward
    return formulas
