"""Linear cross-entropy computed in chunks of tokens: the LM head and the loss without the
full (tokens x vocabulary) logits, in forward and backward.

Per chunk of rows the forward computes the chunk's logits, its summed loss and at once the
gradient of that loss with respect to the chunk's hidden states, the head weight and bias.
Only those gradients are kept for backward (tokens x hidden, vocabulary x hidden): backward
scales them by the incoming gradient. The largest temporary is one chunk's logits, which
the chunk size keeps about as large as the hidden states.

Numerics follow what a Hugging Face causal LM does without fusion: the head's matmuls run
under the caller's autocast (so in its dtype, the weight cast once through autocast's
cache, as the unfused head is) or else in the tensors' own dtype, the logits
are upcast to float32 for the softmax, targets equal to `IGNORE_INDEX` count for nothing,
and the loss is the sum over counted tokens divided by `divisor` (their number by default).
The weight's gradient is accumulated over chunks in float32."""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

IGNORE_INDEX = -100


def chunk_rows(rows: int, hidden_size: int, vocab_size: int) -> int:
    """Rows per chunk: enough that one chunk's logits (rows x vocabulary) hold about as many
    elements as all the hidden states (rows x hidden), so the chunk costs no more memory
    than the activations it reads."""
    return max(1, math.ceil(rows / max(1, math.ceil(vocab_size / hidden_size))))


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                 targets: torch.Tensor, divisor: torch.Tensor | None = None) -> torch.Tensor:
    """Scalar loss of `hidden @ weight.T + bias` against `targets`.

    hidden (rows, hidden_size); weight (vocabulary, hidden_size); bias (vocabulary) or
    None; targets (rows,) integer class ids or IGNORE_INDEX; divisor: what the summed loss
    is divided by (default: the number of counted targets, i.e. the mean)."""
    if divisor is None:
        divisor = (targets != IGNORE_INDEX).sum()
    compute_dtype = head_compute_dtype(hidden)
    if not torch.is_grad_enabled():
        return _summed_loss(hidden, weight, bias, targets) / divisor
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, targets, divisor, compute_dtype)


def head_compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The head matmul's dtype as the unfused model would run it (autocast's when on)."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


def _chunk_logits(hidden_chunk, weight, bias) -> torch.Tensor:
    return torch.nn.functional.linear(hidden_chunk, weight, bias).float()


def _chunk_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed loss of the chunk, its log-probabilities, counted-row mask). One fused
    log-softmax pass over the float32 logits, as the unfused loss makes."""
    counted = targets != IGNORE_INDEX
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = log_probs.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
    return -(picked * counted).sum(), log_probs, counted


def _summed_loss(hidden, weight, bias, targets) -> torch.Tensor:
    """The summed loss alone, chunked (evaluation: nothing is kept for backward)."""
    rows = chunk_rows(hidden.shape[0], hidden.shape[1], weight.shape[0])
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], rows):
        logits = _chunk_logits(hidden[start:start + rows], weight, bias)
        total = total + _chunk_loss(logits, targets[start:start + rows])[0]
    return total


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and every gradient; backward scales the stored gradients."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, divisor, dtype):
        needs_hidden, needs_weight = hidden.requires_grad, weight.requires_grad
        needs_bias = bias is not None and bias.requires_grad
        rows = chunk_rows(hidden.shape[0], hidden.shape[1], weight.shape[0])
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if needs_bias else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], rows):
            chunk, chunk_targets = hidden[start:start + rows], targets[start:start + rows]
            # Under autocast the matmuls cast as the unfused head's would (the weight's
            # half copy comes from autocast's cache, made once per forward).
            loss, log_probs, counted = _chunk_loss(_chunk_logits(chunk, weight, bias), chunk_targets)
            total = total + loss
            # d(loss)/d(logits) = (softmax - one_hot(target)) * row_scale, row_scale being
            # 1 / divisor on counted rows and 0 on ignored ones. The scale is applied to the
            # (rows x hidden) operands and results, not to the (rows x vocabulary) logits.
            grad_logits = log_probs.exp_()
            grad_logits.scatter_add_(1, chunk_targets.clamp(min=0).unsqueeze(1),
                                     grad_logits.new_full((len(chunk_targets), 1), -1.0))
            row_scale = (counted / divisor).unsqueeze(1)
            if needs_hidden:
                grad_hidden[start:start + rows] = torch.matmul(grad_logits.to(dtype), weight) * row_scale
            if needs_weight:  # accumulated in float32 over the chunks, in place (out= is the
                # plain addmm kernel, which the step-time model prices as a matmul)
                torch.addmm(grad_weight, grad_logits.t(), chunk.to(dtype).float() * row_scale, out=grad_weight)
            if needs_bias:
                grad_bias.add_(row_scale.squeeze(1) @ grad_logits)
            del log_probs, grad_logits
        ctx.save_for_backward(grad_hidden, _to(grad_weight, weight.dtype), _to(grad_bias, None if bias is None else bias.dtype))
        return total / divisor

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        # In place: the stored gradients are used once, and a copy would double their memory.
        scaled = [None if g is None else g.mul_(grad_output.to(g.dtype)) for g in (grad_hidden, grad_weight, grad_bias)]
        return scaled[0], scaled[1], scaled[2], None, None, None


def _to(tensor: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    return tensor if tensor is None or dtype is None else tensor.to(dtype)
