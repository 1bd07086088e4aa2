"""The kernels of the Liger stand-in (trainwise/techniques/liger_stand_in.py), one custom op each.

Liger-Kernel's Triton kernels cannot run on fake tensors, so the estimate traces these in
their place. Each op is what one Liger kernel launch is to the trace: it reads its inputs,
writes its outputs (or, where Liger writes in place, the tensors it mutates) and allocates
nothing else, because under FakeTensorMode only its registered fake runs (new outputs of
the kernel's shapes and dtypes). The step-time model then prices one op per kernel, not
the element-wise ops of the plain PyTorch body. The bodies are plain PyTorch on real
tensors (any device), computing the same math as the unfused Hugging Face modules, so a
CPU test can check the stand-in against them.

Dtypes follow Liger's kernels: an RMSNorm's output has its input's dtype and its
reciprocal RMS is float32 per row; the gated activations compute in float32 and store
in the operands' dtype; gradients overwrite the saved operands (gated MLP), the incoming
gradient (RMSNorm with in_place, rotary embedding) as Liger's backward kernels do."""

from __future__ import annotations

import math

import torch
from torch import Tensor

_GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715


# ---------------------------------------------------------------- RMSNorm
@torch.library.custom_op("trainwise::liger_rms_norm", mutates_args=())
def rms_norm_kernel(x: Tensor, weight: Tensor, eps: float, offset: float,
                    gemma_casting: bool) -> tuple[Tensor, Tensor]:
    """(output like x, float32 reciprocal RMS per row) of rows `x` (rows, hidden).

    Llama casting: only the statistics are float32, the normalized rows are cast back to
    x's dtype before the weight multiplies them; Gemma casting: all float32, `offset`
    (1.0) added to the weight."""
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(-1) + eps)
    normalized = x32 * rstd[:, None]
    if gemma_casting:
        return (normalized * (offset + weight.float())).to(x.dtype), rstd
    return (normalized.to(x.dtype) * (offset + weight)).to(x.dtype), rstd


@rms_norm_kernel.register_fake
def _(x, weight, eps, offset, gemma_casting):
    return torch.empty_like(x), x.new_empty(x.shape[0], dtype=torch.float32)


@torch.library.custom_op("trainwise::liger_rms_norm_backward", mutates_args=("grad_input",))
def rms_norm_backward_kernel(grad_output: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float,
                             gemma_casting: bool, grad_input: Tensor) -> Tensor:
    """Writes the input's gradient into `grad_input` (which may be `grad_output` itself,
    Liger's in-place mode) and returns the weight's gradient in the weight's dtype."""
    dy = grad_output.float()
    normalized = x.float() * rstd[:, None]
    scaled = dy * (offset + weight.float())
    dx = rstd[:, None] * (scaled - normalized * (scaled * normalized).mean(-1, keepdim=True))
    kept = normalized if gemma_casting else normalized.to(x.dtype).float()
    grad_weight = (dy * kept).sum(0).to(weight.dtype)
    grad_input.copy_(dx)
    return grad_weight


@rms_norm_backward_kernel.register_fake
def _(grad_output, x, weight, rstd, offset, gemma_casting, grad_input):
    return torch.empty_like(weight)


# ---------------------------------------------------------------- gated activations
def _activation_and_slope(a32: Tensor, activation: str) -> tuple[Tensor, Tensor]:
    """(act(a), act'(a)) in float32: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    if activation == "silu":
        sig = torch.sigmoid(a32)
        return a32 * sig, sig * (1 + a32 * (1 - sig))
    inner = _GELU_TANH_SCALE * (a32 + _GELU_TANH_CUBIC * a32.pow(3))
    tanh = torch.tanh(inner)
    slope = 0.5 * (1 + tanh) + 0.5 * a32 * (1 - tanh.pow(2)) * _GELU_TANH_SCALE * (1 + 3 * _GELU_TANH_CUBIC * a32.pow(2))
    return 0.5 * a32 * (1 + tanh), slope


@torch.library.custom_op("trainwise::liger_gated_activation", mutates_args=())
def gated_activation_kernel(a: Tensor, b: Tensor, activation: str) -> Tensor:
    """act(a) * b: the gate's activation in float32, stored in b's dtype."""
    return _activation_and_slope(a.float(), activation)[0].to(b.dtype) * b


@gated_activation_kernel.register_fake
def _(a, b, activation):
    return torch.empty_like(a)


@torch.library.custom_op("trainwise::liger_gated_activation_backward", mutates_args=("a", "b"))
def gated_activation_backward_kernel(grad_output: Tensor, a: Tensor, b: Tensor, activation: str) -> None:
    """Overwrites `a` with its gradient and `b` with its, recomputing act(a) (Liger keeps
    only the two operands)."""
    act, slope = _activation_and_slope(a.float(), activation)
    grad32 = grad_output.float()
    grad_a = grad32 * b.float() * slope
    grad_b = grad32 * act.to(b.dtype).float()
    a.copy_(grad_a)
    b.copy_(grad_b)


@gated_activation_backward_kernel.register_fake
def _(grad_output, a, b, activation):
    return None


# ---------------------------------------------------------------- rotary embedding
def _rotated(x: Tensor, cos: Tensor, sin: Tensor, backward: bool) -> Tensor:
    """x (batch, seq, heads, head_dim) rotated by cos, sin (batch or 1, seq, head_dim):
    x*cos + R(x)*sin with R(x) = (-x2, x1) forward; the transpose g*cos + R^T(g*sin),
    R^T(y) = (y2, -y1), backward."""
    cos, sin = cos.float().unsqueeze(2), sin.float().unsqueeze(2)
    x32 = x.float()
    half = x.shape[-1] // 2
    if not backward:
        return x32 * cos + torch.cat((-x32[..., half:], x32[..., :half]), dim=-1) * sin
    scaled = x32 * sin
    return x32 * cos + torch.cat((scaled[..., half:], -scaled[..., :half]), dim=-1)


@torch.library.custom_op("trainwise::liger_rope", mutates_args=("q", "k"))
def rope_kernel(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, backward: bool) -> None:
    """Rotates q and k (batch, seq, heads, head_dim) in place (their gradients, backward)."""
    q.copy_(_rotated(q, cos, sin, backward))
    k.copy_(_rotated(k, cos, sin, backward))


@rope_kernel.register_fake
def _(q, k, cos, sin, backward):
    return None
