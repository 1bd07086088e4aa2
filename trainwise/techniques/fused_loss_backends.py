"""Which fused linear cross-entropy runs: on CUDA, liger-kernel's or cut-cross-entropy's
when one is installed (detected at run time, liger first); otherwise, and on every other
device, the chunked PyTorch one (trainwise/techniques/fused_loss.py). The estimate traces fake
CPU tensors, so it always sees the chunked one (the CUDA kernels keep the same gradients
for backward: tokens x hidden and vocabulary x hidden)."""

from __future__ import annotations

import functools
import importlib.util

import torch

from trainwise.techniques.fused_loss import IGNORE_INDEX, head_compute_dtype, chunked_linear_cross_entropy

PYTORCH, LIGER, CUT = "pytorch-chunked", "liger", "cut-cross-entropy"


@functools.lru_cache(maxsize=None)
def cuda_implementation() -> str:
    """The implementation a CUDA tensor gets on this installation."""
    if importlib.util.find_spec("liger_kernel") is not None:
        return LIGER
    if importlib.util.find_spec("cut_cross_entropy") is not None:
        return CUT
    return PYTORCH


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               targets: torch.Tensor, divisor: torch.Tensor | None) -> tuple[torch.Tensor, str]:
    """(scalar loss, implementation name). hidden (rows, hidden_size), weight (vocabulary,
    hidden_size), targets (rows,) with IGNORE_INDEX for tokens that count for nothing;
    the loss is summed over counted tokens and divided by `divisor` (default: their number)."""
    implementation = cuda_implementation() if hidden.is_cuda else PYTORCH
    if implementation == PYTORCH:
        return chunked_linear_cross_entropy(hidden, weight, bias, targets, divisor), PYTORCH
    # The kernels want one dtype: the head runs in autocast's, as the unfused model's would.
    dtype = head_compute_dtype(hidden)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    bias = bias.to(dtype) if bias is not None else None
    reduction = "mean" if divisor is None else "sum"
    if implementation == LIGER:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        loss = liger_fused_linear_cross_entropy(hidden, weight, targets, bias=bias, ignore_index=IGNORE_INDEX,
                                                reduction=reduction)
    else:
        from cut_cross_entropy import linear_cross_entropy

        loss = linear_cross_entropy(hidden, weight, targets, bias=bias, ignore_index=IGNORE_INDEX,
                                    reduction=reduction, shift=False)
    loss = loss[0] if isinstance(loss, tuple) else loss
    return (loss if divisor is None else loss / divisor), implementation
