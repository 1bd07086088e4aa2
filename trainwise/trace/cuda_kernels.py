"""The kernels a CUDA GPU would run where the CPU runs others that save different tensors.

The tracer runs the step on fake CPU tensors. Two ops take another path on CUDA, and the
tensors they keep for backward differ (found by measuring on an H100: BERT-large with
dropout read 13 % high eager and 75 % high with sdpa):

* dropout: CUDA runs the fused `native_dropout`, which keeps a 1-byte mask; the CPU
  multiplies by a scaled noise tensor of the input's dtype and keeps that (4 bytes an
  element in fp32).
* scaled_dot_product_attention with dropout: the CPU's fused kernel refuses dropout, so the
  CPU falls back to the math path and keeps the attention probabilities (batch x heads x
  seq x seq); CUDA's flash or memory-efficient kernels keep only the output and one
  log-sum-exp per query row. The trace calls the memory-efficient op itself (its fake
  kernel runs on CPU tensors), after the mask handling CUDA applies first: a boolean mask
  becomes an additive one in the query's dtype.

Without dropout both devices take fused attention kernels that keep the same tensors, so
those calls are left alone. Active only while the trace targets a CUDA device.

The two functions are replaced in `torch.nn.functional` for the duration of the trace
(models look them up there at call time) rather than intercepted by a TorchFunctionMode:
a mode is suspended while it handles `backward`, so the forward that activation
checkpointing recomputes during backward would run the CPU kernels again."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from trainwise.trace.process_wide import SharedPatch

_cpu_dropout = F.dropout
_cpu_attention = F.scaled_dot_product_attention


def _install():
    F.dropout, F.scaled_dot_product_attention = _cuda_dropout, _cuda_attention


def _remove(_handle):
    F.dropout, F.scaled_dot_product_attention = _cpu_dropout, _cpu_attention


_CUDA_FUNCTIONS = SharedPatch(_install, _remove)


def cuda_kernel_choices(target_device_type: str):
    """The context the traced step runs under: CUDA's dropout and attention for a CUDA target."""
    return _CUDA_FUNCTIONS.active() if target_device_type == "cuda" else contextlib.nullcontext()


def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    if not training or not 0.0 < p < 1.0 or input.numel() == 0:
        return _cpu_dropout(input, p, training, inplace)
    output, _mask = torch.native_dropout(input, p, True)
    return input.copy_(output) if inplace else output


def _cuda_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    if dropout_p == 0.0:
        return _cpu_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    if torch.is_autocast_enabled("cpu"):  # CUDA autocast runs attention in lower precision
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dtype)
    if enable_gqa and key.size(-3) != query.size(-3):  # the efficient kernel wants equal heads
        repeats = query.size(-3) // key.size(-3)
        key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
        attn_mask = _aligned_bias(attn_mask, query, key)
    with torch.autocast("cpu", enabled=False):
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, query.requires_grad or key.requires_grad or value.requires_grad,
            dropout_p, is_causal, scale=scale)[0]


def _aligned_bias(bias: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The bias as CUDA hands it to the kernel: expanded to (batch, heads, queries, keys),
    its last dimension padded to a multiple of 16 elements when it is not one already."""
    shape = (query.size(0), query.size(-3), query.size(-2), key.size(-2))
    keys = shape[-1]
    if keys % 16:
        padded = F.pad(bias, (0, 16 - keys % 16))
        bias = padded[..., :keys]
    return bias.expand(shape)
