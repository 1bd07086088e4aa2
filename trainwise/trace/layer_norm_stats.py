"""The dtype of the per-row mean and reciprocal deviation a layer norm keeps for backward.

`native_layer_norm` returns (output, mean, rstd), and autograd saves mean and rstd. Their
dtype is not the input's in two cases the fake kernel (which returns the input's dtype on
CPU tensors) gets wrong:

* the CPU kernel, on a bfloat16/float16 input with float32 weight or bias (a float32
  LayerNorm under bf16 autocast, where layer_norm is not cast up): float32 statistics;
* the CUDA kernel: always the accumulate type, float32 for a bfloat16/float16 input (a
  bf16-pure model's layer norms).

The allocation recorder hands the statistics on in the real kernel's dtype (the fake ones
they replace are never recorded). They are small, one float per row of the input, but a
bf16 model's layer norms keep them in every block."""

from __future__ import annotations

import torch

_LOWER = (torch.bfloat16, torch.float16)


def layer_norm_fixes(target_device_type: str, low_precision: bool) -> dict:
    """The recorder's output fix for `native_layer_norm` (AllocationRecorder.output_fixes);
    none when no tensor can be bf16/fp16 (`low_precision` False: fp32 weights, no
    autocast). The fake statistics it replaces are never recorded."""
    if not low_precision:
        return {}

    def fix(out, input, normalized_shape, weight=None, bias=None, eps=None):
        output, mean, rstd = out
        dtype = statistics_dtype(target_device_type, input, weight, bias)
        if mean.dtype == dtype:
            return out
        return output, torch.empty_like(mean, dtype=dtype), torch.empty_like(rstd, dtype=dtype)

    return {torch.ops.aten.native_layer_norm.default: fix}


def statistics_dtype(device_type: str, input: torch.Tensor, weight: torch.Tensor | None,
                     bias: torch.Tensor | None) -> torch.dtype:
    """The dtype of the mean and rstd the real kernel of `device_type` returns."""
    if input.dtype not in _LOWER:
        return input.dtype
    if device_type == "cuda":
        return torch.float32
    params = [t for t in (weight, bias) if t is not None]
    return torch.float32 if any(t.dtype == torch.float32 for t in params) else input.dtype
