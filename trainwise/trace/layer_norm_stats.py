"""The dtype of the per-row mean and reciprocal deviation a layer norm keeps for backward.

`native_layer_norm` returns (output, mean, rstd), and autograd saves mean and rstd. Their
dtype is not the input's in two cases the fake kernel (which returns the input's dtype on
CPU tensors) gets wrong:

* the CPU kernel, on a bfloat16/float16 input with float32 weight or bias (a float32
  LayerNorm under bf16 autocast, where layer_norm is not cast up): float32 statistics;
* the CUDA kernel: always the accumulate type, float32 for a bfloat16/float16 input (a
  bf16-pure model's layer norms).

The fix is a dispatch mode, entered below the allocation recorder, that hands back the
statistics in the real kernel's dtype (the fake ones it replaces are never recorded). It
is small: one float per row of the input."""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_LOWER = (torch.bfloat16, torch.float16)


def layer_norm_statistics(target_device_type: str, low_precision: bool):
    """The mode for a trace; nothing when no tensor can be bf16/fp16 (`low_precision`
    False: fp32 weights, no autocast), so those traces run as fast as before."""
    return LayerNormStatistics(target_device_type) if low_precision else contextlib.nullcontext()


class LayerNormStatistics(TorchDispatchMode):
    """Active during the trace: layer-norm statistics in the target device's dtype."""

    def __init__(self, target_device_type: str):
        super().__init__()
        self.target_device_type = target_device_type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is not torch.ops.aten.native_layer_norm.default:
            return out
        dtype = statistics_dtype(self.target_device_type, *_inputs(*args, **(kwargs or {})))
        output, mean, rstd = out
        if mean.dtype == dtype:
            return out
        return output, torch.empty_like(mean, dtype=dtype), torch.empty_like(rstd, dtype=dtype)


def statistics_dtype(device_type: str, input: torch.Tensor, weight: torch.Tensor | None,
                     bias: torch.Tensor | None) -> torch.dtype:
    """The dtype of the mean and rstd the real kernel of `device_type` returns."""
    if input.dtype not in _LOWER:
        return input.dtype
    if device_type == "cuda":
        return torch.float32
    params = [t for t in (weight, bias) if t is not None]
    return torch.float32 if any(t.dtype == torch.float32 for t in params) else input.dtype


def _inputs(input, normalized_shape, weight=None, bias=None, eps=None):
    return input, weight, bias
