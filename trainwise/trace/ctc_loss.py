"""The CTC loss on fake tensors.

`torch.nn.functional.ctc_loss` reads the input and target lengths' values on the host
before any kernel runs (to size its buffers), which a fake tensor does not have, and the
target list it is given comes from `masked_select`, whose size depends on the mask's
values. The batch a trace runs is a plain synthetic one (trainwise/models/media_batch.py):
every transcript has the same length and no padding, so every mask is all true and the
lengths are read from the shapes. On that batch this stand-in allocates what PyTorch's CTC
kernels do (CPU and CUDA alike): in forward the per-sample losses (batch) and the alpha
table (batch x frames x (2 x target length + 1)), both kept for backward with the log
probabilities and the targets; in backward a gradient the shape of the log probabilities
and a beta table the size of the alpha one; and the "mean" reduction's per-sample
division. The values are not computed (a trace needs none)."""

from __future__ import annotations

import contextlib

import torch
from torch.nn import functional


class _CtcTables(torch.autograd.Function):
    """Per-sample negative log likelihoods, with the buffers the real kernels make."""

    @staticmethod
    def forward(ctx, log_probs: torch.Tensor, targets: torch.Tensor, target_length: int) -> torch.Tensor:
        frames, batch, _ = log_probs.shape
        log_alpha = log_probs.new_empty((batch, frames, 2 * target_length + 1))
        losses = log_probs.new_empty((batch,))
        ctx.save_for_backward(log_probs, targets, losses, log_alpha)
        return losses

    @staticmethod
    def backward(ctx, grad_losses: torch.Tensor):
        log_probs, _, _, log_alpha = ctx.saved_tensors
        grad = torch.full_like(log_probs, float("-inf"), memory_format=torch.contiguous_format)
        log_beta = torch.empty_like(log_alpha, memory_format=torch.contiguous_format)
        del log_beta  # a workspace: freed when the kernel returns
        return grad, None, None


def traced_ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0, reduction: str = "mean",
                    zero_infinity: bool = False):
    """`functional.ctc_loss`'s signature, for the equal-length transcripts of a trace."""
    batch = log_probs.shape[1]
    target_length = targets.shape[1] if targets.dim() == 2 else targets.numel() // batch
    losses = _CtcTables.apply(log_probs, targets, target_length)
    if zero_infinity:
        losses = torch.where(losses == float("inf"), losses.new_zeros(()), losses)
    if reduction == "mean":
        lengths = losses.new_full((batch,), float(target_length)).clamp_min(1)
        return (losses / lengths).mean()
    return losses.sum() if reduction == "sum" else losses


@contextlib.contextmanager
def traceable_ctc_loss():
    """Route `functional.ctc_loss` (which transformers' CTC loss calls) through the stand-in."""
    original = functional.ctc_loss
    functional.ctc_loss = traced_ctc_loss
    try:
        yield
    finally:
        functional.ctc_loss = original
