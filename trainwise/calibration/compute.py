"""Calibration of tensor contractions: matmul and attention throughput per dtype.

Matmuls are timed over square shapes and the skinny shapes of a transformer layer
(tokens x hidden times hidden x 3/4 hidden and back), each 2*m*k*n FLOPs, so the fitted
Rate covers the shapes a trace holds. Attention is torch's scaled_dot_product_attention,
causal, forward and backward together, its FLOPs counted as torch.utils.flop_counter
counts them (the same counter the trace uses, which does not halve causal attention), one
Rate per head dim of HEAD_DIMS."""

from __future__ import annotations

import contextlib

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from trainwise.calibration.timing import Fit, Settings, fit, measure_sizes, synchronizer
from trainwise.hardware.gpu import FLOAT8_CAPABILITY
from trainwise.techniques.float8 import FLOAT8_ALIGNMENT

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "fp8": torch.float8_e4m3fn}


def dtypes_to_measure(device: torch.device) -> list[str]:
    """The dtype names the device runs: the CPU fp32 and bf16 (when a bf16 matmul runs),
    a GPU fp32, tf32 (Ampere and newer), bf16 (where supported), fp16 and fp8 (compute
    capability 8.9 and newer: what --float8's torch._scaled_mm runs on)."""
    if device.type == "cpu":
        return ["fp32"] + (["bf16"] if _runs(device, torch.bfloat16) else [])
    names = ["fp32"]
    capability = torch.cuda.get_device_capability(device)
    if capability >= (8, 0):
        names.append("tf32")
    if torch.cuda.is_bf16_supported():
        names.append("bf16")
    return names + ["fp16"] + (["fp8"] if capability >= FLOAT8_CAPABILITY else [])


def _runs(device: torch.device, dtype: torch.dtype) -> bool:
    try:
        torch.ones(4, 4, dtype=dtype, device=device) @ torch.ones(4, 4, dtype=dtype, device=device)
        return True
    except RuntimeError:
        return False


@contextlib.contextmanager
def tf32_allowed(on: bool):
    """TF32 tensor cores on or off for CUDA matmuls (and cuDNN) inside the block."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def matmul_shapes(device: torch.device, settings: Settings) -> list[tuple[int, int, int]]:
    """(m, k, n) shapes: squares, and a layer's projections at a few hidden sizes."""
    if device.type == "cuda":
        squares, hiddens, tokens = (256, 1024, 2048, 4096, 8192), (1024, 2048, 4096), 4096
    elif settings.quick:
        squares, hiddens, tokens = (32, 128, 256), (64,), 128
    else:
        squares, hiddens, tokens = (64, 128, 256, 512, 768, 1024), (128, 256, 512), 512
    skinny = [shape for h in hiddens for shape in ((tokens, h, 3 * h), (tokens, h, 4 * h), (tokens, 4 * h, h))]
    return [(n, n, n) for n in squares] + skinny


def measure_matmul(device: torch.device, dtype_name: str, settings: Settings) -> Fit:
    """The matmul Rate (FLOPs) of `dtype_name` on `device`; fp8: torch._scaled_mm, as
    --float8 multiplies (fp8_matmul)."""
    dtype, sync = TORCH_DTYPES[dtype_name], synchronizer(device)

    def case(m: int, k: int, n: int):
        if dtype_name == "fp8":
            m, k, n = (-(-size // FLOAT8_ALIGNMENT) * FLOAT8_ALIGNMENT for size in (m, k, n))

        def make():
            a = torch.randn(m, k, device=device).to(dtype)
            if dtype_name == "fp8":
                return fp8_matmul(a, torch.randn(n, k, device=device).to(dtype))
            b = torch.randn(k, n, device=device).to(dtype)
            return lambda: torch.mm(a, b)
        return 2 * m * k * n, make

    cases = [case(*shape) for shape in matmul_shapes(device, settings)]
    with tf32_allowed(dtype_name == "tf32") if device.type == "cuda" else contextlib.nullcontext():
        return fit(measure_sizes(cases, sync, settings))


def fp8_matmul(a: torch.Tensor, b_rows: torch.Tensor):
    """The call torchao's Float8Linear makes: `a` (m x k, row-major) times `b_rows`
    transposed (k x n, column-major, as cuBLASLt's fp8 kernels need), per-tensor scales,
    a bf16 result."""
    scale = torch.ones((), device=a.device)
    b = b_rows.t()
    return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


# Head dims whose attention rate calibrate measures. A CPU's attention kernel runs a head
# dim of 16 at about a third of its rate at 64 in bf16 (its softmax over the scores is the
# same work whatever the head dim, its FLOPs are not), so one rate misprices small heads.
HEAD_DIMS = (16, 32, 64, 128)


def attention_shapes(device: torch.device, settings: Settings, head_dim: int) -> list[tuple[int, int, int, int]]:
    """(batch, heads, sequence, head dim) shapes at `head_dim` over a range of sequence
    lengths: all of them at the device's reference head dim (whose fit is the profile's one
    attention rate, as before head dims were measured), the three middle ones at the others
    (enough for a rate, and what keeps calibrate short)."""
    batch, heads, lengths, reference = _attention_setup(device, settings)
    return [(batch, heads, s, head_dim) for s in (lengths if head_dim == reference else lengths[1:4])]


def reference_head_dim(device: torch.device, settings: Settings) -> int:
    """The head dim of the profile's one attention rate (the one older profiles hold)."""
    return _attention_setup(device, settings)[3]


def _attention_setup(device: torch.device, settings: Settings) -> tuple[int, int, tuple[int, ...], int]:
    """(batch, heads, sequence lengths, reference head dim) of the attention timed."""
    if device.type == "cuda":
        return 4, 16, (256, 512, 1024, 2048, 4096), 128
    if settings.quick:
        return 1, 2, (32, 64, 128), 32
    return 1, 4, (64, 128, 256, 512, 1024), 64


def attention_flops(shape: tuple[int, int, int, int]) -> int:
    """Forward plus backward FLOPs of one attention call, as torch's flop counter counts them."""
    return sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape)


def measure_attention(device: torch.device, dtype_name: str, settings: Settings) -> dict[int, Fit]:
    """The attention Rate (FLOPs, forward and backward) of `dtype_name` on `device`, by head dim."""
    dtype, sync = TORCH_DTYPES[dtype_name], synchronizer(device)

    def case(shape):
        def make():
            q, k, v = (torch.randn(shape, device=device).to(dtype).requires_grad_() for _ in range(3))
            grad = torch.randn(shape, device=device).to(dtype)

            def step():
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, (q, k, v), grad)
            return step
        return attention_flops(shape), make

    fits = {}
    with tf32_allowed(dtype_name == "tf32") if device.type == "cuda" else contextlib.nullcontext():
        for head_dim in HEAD_DIMS:
            cases = [case(shape) for shape in attention_shapes(device, settings, head_dim)]
            fits[head_dim] = fit(measure_sizes(cases, sync, settings))
    return fits
